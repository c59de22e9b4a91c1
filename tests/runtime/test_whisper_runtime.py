"""tinyt's own transcription (runtime/transcribe.py) against transformers'
WhisperForConditionalGeneration.generate on the same random-weight Whisper
(tests/whisper_fixtures.py: tiny's shape, and large-v3-turbo's 128 mel bins and vocabulary,
slow) and the same features of espeak-ng speech: the generated tokens identical for greedy and
beams, with and without timestamps, a forced and a detected language, translate, a prompt,
and long-form audio over 30 s (sequential windows from the last timestamp), with the segments'
times; bad arguments refused by name; `tinyt transcribe` (text, json, srt, vtt; progress on stderr;
a file that is not audio a clear error) and runtime/subtitles.py.

Why tokens may be compared for identity: the graphs' logits are transformers' within ONNX_ATOL
(1e-4, tests/export/test_whisper_export.py; measured ~1e-6), so a choice can differ only
where its two best candidates lie within 2e-4 of each other. The fixture's weights (STD 0.1:
logits of size ~10) leave every step's best clear of the second: the greedy case checks that
margin on transformers' own processed scores (measured minimum well above 2e-4)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch
from cli_run import run_cli
from whisper_fixtures import save_whisper

import tinyt.runtime as rt
from tinyt.errors import ConfigError
from tinyt.runtime.audio import load_audio, log_mel

ONNX_ATOL = 1e-4  # the graphs' logits against transformers' (the export test's bound)
N = 20  # tokens a window: every case stays short
SAID = "The quick brown fox jumps over the lazy dog."
pytestmark = [pytest.mark.filterwarnings("ignore"),  # transformers' notes on Whisper's rules
              pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                 reason="espeak-ng is not installed (scripts/setup.sh)")]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _speech(tmp, text: str = SAID) -> np.ndarray:
    wav = tmp / "said.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, timeout=60)
    return load_audio(wav)


_built: dict[str, tuple] = {}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (transformers' model, the loaded SpeechModel, the artifact, speech samples)."""
    def make(name: str):
        if name not in _built:
            from tinyt.export import export_onnx
            from tinyt.hf import import_hf

            root = tmp_path_factory.mktemp(name)
            theirs = save_whisper(name, root / "hf")
            out = export_onnx(import_hf(root / "hf", root / "ck"), root / "onnx")
            _built[name] = (theirs, rt.load(out, threads=1), out, _speech(root))
        return _built[name]
    return make


def _theirs(model, features: np.ndarray, **kw) -> list[int]:
    with torch.no_grad():
        return model.generate(torch.from_numpy(features)[None], max_new_tokens=N,
                              **kw)[0].tolist()


CASES = {  # ours (transcribe's keywords) -> transformers' (generate's)
    "greedy": (dict(language="en"), dict(language="en", task="transcribe")),
    "timestamps": (dict(language="en", timestamps=True),
                   dict(language="en", task="transcribe", return_timestamps=True)),
    "beams": (dict(language="en", num_beams=3), dict(language="en", num_beams=3)),
    "beams, timestamps": (dict(language="en", num_beams=4, timestamps=True),
                          dict(language="en", num_beams=4, return_timestamps=True)),
    "detected": (dict(), dict(task="transcribe")),
    "translate": (dict(task="translate", timestamps=True),
                  dict(task="translate", return_timestamps=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tokens_equal_transformers_generate(case, built):
    theirs, ours, _, samples = built("tiny")
    mine, kw = CASES[case]
    got = ours.transcribe(samples, max_new_tokens=N, **mine)
    assert got.tokens == _theirs(theirs, log_mel(samples, 80), **kw), case
    assert got.segments and got.tokens == [t for s in got.segments for t in s.tokens]
    if "language" not in mine:  # transformers' detect_language, on the first window
        with torch.no_grad():
            lang = theirs.detect_language(torch.from_numpy(log_mel(samples, 80))[None])
        assert ours.language_id(got.language) == int(lang[0])


def test_each_greedy_choice_is_clear_of_the_logits_tolerance(built):
    """The margin that makes identity the right test: best minus second-best processed score
    at each step, over 2 x ONNX_ATOL (both sides may move by ONNX_ATOL)."""
    theirs, _, _, samples = built("tiny")
    with torch.no_grad():
        out = theirs.generate(torch.from_numpy(log_mel(samples, 80))[None], max_new_tokens=N,
                              language="en", return_dict_in_generate=True, output_scores=True)
    top2 = torch.stack(out.scores)[:, 0].topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    assert margin > 2 * ONNX_ATOL, margin


def test_decode_features_batches_windows_as_transformers_generate_one_by_one(built):
    """SpeechModel.decode_features (the peer benchmark's call): a batch of two windows gives
    each window's tokens as transformers' generate on it alone, greedy and with beams; the
    final <|endoftext|> left out."""
    theirs, ours, _, samples = built("tiny")
    windows = np.stack([log_mel(samples, 80), log_mel(samples[:len(samples) // 2], 80)])
    for beams in (1, 3):
        got = ours.decode_features(windows, max_new_tokens=N, num_beams=beams)
        want = [[t for t in _theirs(theirs, w, language="en", num_beams=beams) if t != ours.eos]
                for w in windows]
        assert want[0] != want[1] and got == want, beams
    with pytest.raises(ConfigError, match=r"features of shape \(80, 3000\): \[windows >= 1, 80"):
        ours.decode_features(windows[0])
    with pytest.raises(ConfigError, match="language=None: decode_features takes"):
        ours.decode_features(windows, language=None)


def test_a_prompt_goes_before_the_start_token(built):
    theirs, ours, _, samples = built("tiny")
    got = ours.transcribe(samples, language="en", prompt="  Fox, dog. ", max_new_tokens=N)
    ids = ours.tokenizer.hf.encode(" Fox, dog.", add_special_tokens=False).ids
    want = _theirs(theirs, log_mel(samples, 80), language="en",
                   prompt_ids=torch.tensor([ours.tokens["previous"], *ids]))
    assert got.tokens == want


def test_long_form_continues_from_the_last_timestamp(built, tmp_path):
    """Over 30 s (speech, 30 s of silence, speech): transformers' long-form generate on the
    whole audio's features, tokens and segment times equal; the windows reported."""
    theirs, ours, _, samples = built("tiny")
    audio = np.concatenate([samples, np.zeros(30 * 16_000, np.float32), samples])
    seen = []
    got = ours.transcribe(audio, language="en", max_new_tokens=N,
                          progress=lambda done, total: seen.append((done, total)))
    features = log_mel(audio, 80, whole=True)
    assert features.shape[1] == audio.size // 160 > 3000
    with torch.no_grad():
        want = theirs.generate(torch.from_numpy(features)[None], language="en",
                               max_new_tokens=N, return_timestamps=True, return_segments=True)
    assert got.tokens == want["sequences"][0].tolist()
    times = [(round(float(s["start"]), 3), round(float(s["end"]), 3))
             for s in want["segments"][0]]
    assert [(s.start, s.end) for s in got.segments] == times
    total = round(audio.size // 160 / 100, 2)
    assert len(seen) >= 3 and seen[0] == (0.0, total) and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)  # a window or more each time
    assert got.duration == round(audio.size / 16_000, 3)


def test_whisper_rules_mask_what_transformers_processors_mask():
    """WhisperRules against transformers' SuppressTokensAtBegin, SuppressTokens and
    WhisperTimeStamp processors on random scores, for histories that reach each timestamp
    rule (first step, a lone timestamp, a closed pair, text after timestamps, a timestamp
    whose probability mass beats the text): the same tokens left at -inf."""
    from transformers import GenerationConfig
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
        WhisperTimeStampLogitsProcessor,
    )
    from whisper_fixtures import generation_config

    from tinyt.runtime.transcribe import WhisperRules

    gen = generation_config(51865, 2)
    prompt, T = [50258, 50259, 50359], 50364
    config = GenerationConfig(**gen)
    theirs = LogitsProcessorList([
        SuppressTokensAtBeginLogitsProcessor(gen["begin_suppress_tokens"], len(prompt)),
        SuppressTokensLogitsProcessor(gen["suppress_tokens"]),
        WhisperTimeStampLogitsProcessor(config, begin_index=len(prompt))])
    ours = WhisperRules(begin_index=len(prompt), eos=50257, suppress=tuple(gen[
        "suppress_tokens"]), begin_suppress=tuple(gen["begin_suppress_tokens"]),
        timestamps=True, timestamp_begin=T, no_timestamps=T - 1, max_initial=50)
    rng = np.random.default_rng(0)
    for generated in ([], [T + 3], [T + 3, 400], [T + 3, 400, T + 9], [T + 3, 400, T + 9, T + 9],
                      [T, 400, 401], [T + 5, 400, T + 7, T + 7, 402]):
        scores = rng.standard_normal((2, 51865)).astype(np.float32) * 3
        scores[1, T + 20] = 40.0  # a timestamp's mass above every text token: forced
        ids = torch.tensor([prompt + generated] * 2)
        want = theirs(ids, torch.from_numpy(scores.copy())).numpy()
        got = scores.copy()
        ours.apply(got, [prompt + generated] * 2, len(generated))
        assert np.array_equal(np.isinf(got), np.isinf(want)), generated
        assert np.array_equal(got[np.isfinite(got)], want[np.isfinite(want)]), generated


@pytest.mark.slow
@pytest.mark.parametrize("timestamps", [False, True])
def test_large_v3_turbo_shapes(timestamps, built):
    """128 mel bins, the 51,866-token vocabulary (task ids a place later), one decoder layer."""
    theirs, ours, _, samples = built("large-v3-turbo")
    got = ours.transcribe(samples, timestamps=timestamps, max_new_tokens=N)
    want = _theirs(theirs, log_mel(samples, 128), task="transcribe",
                   return_timestamps=timestamps)
    assert got.tokens == want


@pytest.mark.parametrize("kw, says", [
    (dict(language="xx"), "language='xx' is not one of this model's languages; it takes the "
     "codes af, am, ar,"),
    (dict(task="summarise"), "task='summarise' is invalid: one of transcribe, translate"),
    (dict(max_new_tokens=446), "max_new_tokens=446 is invalid: an integer in 0..444"),
    (dict(timestamps="yes"), "timestamps='yes' is invalid: True or False"),
    (dict(num_beams=0), "num_beams=0 is invalid"),
    (dict(num_beams=2, temperature=0.5), "beam search here is deterministic"),
    (dict(prompt=3), "prompt=3 is invalid: a string"),
])
def test_bad_arguments_are_refused_by_name(kw, says, built):
    _, ours, _, samples = built("tiny")
    with pytest.raises(ConfigError, match=re.escape(says)):
        ours.transcribe(samples, **{"language": "en", **kw})


def test_an_english_only_model_takes_no_language_or_task(built):
    """tiny.en's prompt: <|startoftranscript|> [<|notimestamps|>], no language detected."""
    import copy

    _, ours, _, samples = built("tiny")
    english = copy.copy(ours)
    english.multilingual = False
    for kw in (dict(language="de"), dict(task="translate")):
        with pytest.raises(ConfigError, match="this model is English-only; leave language and "
                                              "task out"):
            english.transcribe(samples, **kw)
    for timestamps in (False, True):
        got = english.transcribe(samples, timestamps=timestamps, max_new_tokens=4)
        assert got.language == "en" and len(got.tokens) <= 4 * len(got.segments)


def test_sampling_is_seeded_and_the_result_reads_as_json(built):
    _, ours, _, samples = built("tiny")
    a, b = (ours.transcribe(samples, language="en", temperature=1.0, seed=3, max_new_tokens=8)
            for _ in range(2))
    assert a.tokens == b.tokens and len(a.tokens) <= 8
    data = json.loads(json.dumps(a.to_dict()))
    assert data["language"] == "en" and data["segments"][0]["tokens"] == list(a.tokens)


def _wav(path, samples: np.ndarray) -> None:
    import soundfile

    soundfile.write(str(path), samples, 16_000, subtype="FLOAT")


def test_tinyt_transcribe_writes_text_json_and_subtitles(built, tmp_path, monkeypatch,
                                                          capsys):
    _, ours, art, samples = built("tiny")
    wav = tmp_path / "said.wav"
    _wav(wav, samples)
    want = ours.transcribe(samples, language="en", timestamps=True, max_new_tokens=N)
    common = [art, wav, "--language", "en", "--max-new-tokens", N, "--threads", 1]
    code, out, _ = run_cli(monkeypatch, capsys, "transcribe", *common, "--format", "json",
                           "--timestamps")
    assert code in (0, None) and json.loads(out) == json.loads(json.dumps(want.to_dict()))
    code, out, _ = run_cli(monkeypatch, capsys, "transcribe", *common, "--format", "srt")
    cues = [s for s in want.segments if s.text]
    assert out.startswith("1\n") and out.count(" --> ") == len(cues) and cues[0].text in out
    code, out, _ = run_cli(monkeypatch, capsys, "transcribe", *common, "--format", "vtt")
    assert out.startswith("WEBVTT\n\n") and out.count(" --> ") == len(cues)
    code, out, _ = run_cli(monkeypatch, capsys, "transcribe", *common)
    plain = ours.transcribe(samples, language="en", max_new_tokens=N)
    assert out == plain.text + "\n"


def test_tinyt_transcribe_shows_progress_and_refuses_what_is_not_audio(built, tmp_path,
                                                                      monkeypatch, capsys):
    _, _, art, samples = built("tiny")
    long = tmp_path / "long.wav"
    _wav(long, np.concatenate([samples, np.zeros(31 * 16_000, np.float32)]))
    code, out, err = run_cli(monkeypatch, capsys, "transcribe", art, long, "--language", "en",
                             "--max-new-tokens", 4, "--threads", 1)
    assert code in (0, None) and "long.wav: 0.0 / 3" in err and out.endswith("\n")
    bad = tmp_path / "notes.wav"
    bad.write_text("not audio")
    code, _, err = run_cli(monkeypatch, capsys, "transcribe", art, bad)
    assert code == 2 and "notes.wav is not audio this machine's libsndfile reads" in err
    assert "WAV" in err  # what it reads
    code, _, err = run_cli(monkeypatch, capsys, "transcribe", art, long, long, "--format", "srt")
    assert code == 2 and "--format srt of 2 files: give --output-dir" in err
    code, _, err = run_cli(monkeypatch, capsys, "translate", art, "Hello.")
    assert code == 2 and "is a speech (Whisper) artifact; use 'tinyt transcribe" in err


def test_subtitle_clocks():
    from tinyt.runtime.subtitles import clock

    assert clock(3723.4567, ",") == "01:02:03,457" and clock(0.02, ".") == "00:00:00.020"
