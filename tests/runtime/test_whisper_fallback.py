"""Whisper's long-form heuristics (runtime/fallback.py, through SpeechModel.transcribe) against
transformers 4.57: the fallback / skip decisions against its own _need_fallback on given tokens
and scores; no-speech skipping and condition_on_prev_tokens (greedy) against its generate on
the same features (tokens equal: tests/runtime/test_whisper_runtime.py says why identity is the
right test on this fixture); the temperature ladder at temperature > 0 (tinyt's seeded
generator is not torch's) by which temperatures each window tried, on a stub and on the model.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from cli_run import run_cli
from whisper_fixtures import save_whisper

import tinyt.runtime as rt
from tinyt.errors import ConfigError
from tinyt.runtime.audio import load_audio, log_mel
from tinyt.runtime.fallback import (
    Attempt,
    Fallback,
    compression_ratio,
    decide,
    judge,
    previous_tokens,
    token_logprob,
)

N = 20  # tokens a window
V = 51865  # tiny's vocabulary
pytestmark = [pytest.mark.filterwarnings("ignore"),
              pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                 reason="espeak-ng is not installed (scripts/setup.sh)")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(transformers' model, the loaded SpeechModel, espeak-ng speech samples, the
    artifact's directory)."""
    from tinyt.export import export_onnx
    from tinyt.hf import import_hf

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tiny")
    theirs = save_whisper("tiny", root / "hf")
    out = export_onnx(import_hf(root / "hf", root / "ck"), root / "onnx")
    wav = root / "said.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), "The quick brown fox jumps over the lazy dog."],
                   check=True, timeout=60)
    yield theirs, rt.load(out, threads=1), load_audio(wav), out
    torch.set_num_threads(before)


def _generate(model, features: np.ndarray, **kw):
    with torch.no_grad():
        return model.generate(torch.from_numpy(features)[None], language="en",
                              max_new_tokens=N, **kw)


# -- the decisions, on given tokens and scores ----------------------------------------------
def test_judge_decides_as_transformers_need_fallback():
    """judge's (needs fallback, skip) equal transformers' _need_fallback on random windows:
    repeated or varied tokens (compression ratio above or below 1.35), scores of several
    scales (mean log-probability either side of -1), the temperature's division undone, the
    <|endoftext|> counted, <|nospeech|>'s probability either side of 0.6; both outcomes of
    each decision are met."""
    from transformers.generation.logits_process import WhisperNoSpeechDetection
    from transformers.models.whisper.generation_whisper import WhisperGenerationMixin as W

    rng = np.random.default_rng(0)
    fb = Fallback.check((0.0, 0.2), 1.35, -1.0, 0.6)
    cfg = SimpleNamespace(compression_ratio_threshold=1.35, logprob_threshold=-1.0,
                          no_speech_threshold=0.6)
    seen = set()
    for case in range(40):
        n, ended, t = int(rng.integers(3, 30)), bool(case % 2), (0.0, 0.4)[case % 4 // 2]
        tokens = (rng.integers(0, 400, n) if case % 3 else np.tile(rng.integers(0, 400, 3),
                                                                    n)[:n]).tolist()
        seq = tokens + [50257] * ended
        scores = rng.standard_normal((len(seq), V)).astype(np.float32) * rng.choice([0.5, 8])
        scores[np.arange(len(seq)), seq] += rng.choice([2.0, 12.0])
        p = float(rng.uniform(0.3, 0.9))
        detector = WhisperNoSpeechDetection(no_speech_token=50361, begin_index=3)
        detector._no_speech_prob = torch.tensor([p])
        rows = [torch.from_numpy(r / (t or 1)) for r in scores]  # generate's scores: z / T
        want = W._need_fallback(W, torch.tensor(seq), [{"scores": rows}], 0, [detector], cfg, V,
                                t)
        attempt = Attempt(tokens, ended, [token_logprob(r, s) for r, s in zip(scores, seq)])
        got = judge(attempt, fb, eos=50257, vocab_size=V, no_speech=lambda p=p: p)
        assert got == want, case
        seen.add(got)
    assert seen == {(False, False), (True, False), (False, True)}, seen


def test_compression_ratio_and_previous_tokens_as_transformers():
    from transformers.models.whisper.generation_whisper import (
        WhisperGenerationMixin as W,
    )
    from transformers.models.whisper.generation_whisper import _pad_to_max_length

    rng = np.random.default_rng(1)
    for tokens in (rng.integers(0, V, 40).tolist(), [7, 8, 9] * 20, [50257]):
        assert compression_ratio(tokens, V) == W._retrieve_compression_ratio(
            torch.tensor(tokens), V)
    T = 50364
    segments = [[T, 400, 401, T + 5, T + 5], [T + 5, 402, T + 9], [403] * 300]
    want = _pad_to_max_length([[{"tokens": torch.tensor(s)} for s in segments]], 50257, "cpu",
                              padding_side="left", bos_token_tensor=torch.tensor([50361]),
                              cut_off_length=223, skip_ending_double_timestamps=True,
                              timestamp_begin=T)
    assert previous_tokens(segments, T, 50361, 223) == want[0].tolist()
    short = previous_tokens(segments[:2], T, 50361, 223)
    assert short == [50361, T, 400, 401, T + 5, T + 5, 402, T + 9]  # one closing stamp less


def test_the_temperature_ladder_on_a_stub():
    """decide tries the temperatures in turn until an attempt passes: a repetitive window at
    0.0 (compression), a doubtful one at 0.2 (log-probability), a good one at 0.4; the kept
    attempt is the last, the next window conditioned below 0.5 only; every attempt failing
    keeps the last; a silent window is skipped at once, and <|nospeech|> is asked only where
    it decides."""
    good = Attempt([400, 401, 402, 403], True, [-0.1] * 5)
    by_t = {0.0: Attempt([7, 8] * 40, True, [-0.1] * 81), 0.2: Attempt([500, 501], True,
                                                                         [-3.0] * 3),
            0.4: good, 0.6: good}
    asked: list[float] = []

    def decode(t):
        asked.append(t)
        return by_t[t]

    def no_speech():
        asked.append(-1)
        return 0.1

    fb = Fallback.check((0.0, 0.2, 0.4, 0.6), 2.4, -1.0, 0.6)
    d = decide(decode, fb, eos=50257, vocab_size=V, no_speech=no_speech)
    assert (d.temperatures, d.attempt, d.skip, d.conditions_next) == ((0.0, 0.2, 0.4), good,
                                                                      False, True)
    assert asked == [0.0, 0.2, -1, 0.4]  # the no-speech probability: at the doubtful one only
    bad = Fallback.check((0.0, 0.2, 0.6), 2.4, -1.0)
    by_t[0.6] = Attempt([9] * 50, False, [-0.1] * 50)
    d = decide(lambda t: by_t[t], bad, eos=50257, vocab_size=V, no_speech=no_speech)
    assert d.temperatures == (0.0, 0.2, 0.6) and d.attempt is by_t[0.6]
    assert not d.conditions_next and not d.skip
    silent = decide(lambda t: by_t[0.2], fb, eos=50257, vocab_size=V, no_speech=lambda: 0.9)
    assert silent.skip and silent.temperatures == (0.0,)


# -- through transcribe, against transformers' generate ---------------------------------------
@pytest.mark.parametrize("beams", [1, 3])
def test_no_speech_skips_a_window_as_transformers(beams, built):
    """A window whose <|nospeech|> probability beats no_speech_threshold and whose mean
    log-probability is below logprob_threshold is skipped (no tokens), and kept where either
    test passes: transformers' generate with the same thresholds gives the same tokens,
    greedy and with beams (the chosen beam's log-probabilities). The thresholds sit 5% either
    side of the window's own values (tinyt's mean, transformers' probability: the graphs move
    them by ~1e-6)."""
    theirs, ours, samples, _ = built
    features = log_mel(samples, 80)
    memory, prefix = ours.encode(features), ours._prefix("en", "transcribe", False)
    settings = ours._settings(len(prefix), False, N, num_beams=beams)
    (tokens,) = ours._window(memory, prefix, settings)
    tokens += [ours.eos] * (len(tokens) < N)
    mean = float(np.mean(ours._rescore(memory, prefix, tokens, settings)))
    with torch.no_grad():
        ids = torch.tensor([[50258]])
        logits = theirs(torch.from_numpy(features)[None], decoder_input_ids=ids).logits
        p = float(logits[0, -1].float().softmax(-1)[ours.tokens["no_timestamps"] - 1])
    plain = ours.transcribe(samples, language="en", max_new_tokens=N, num_beams=beams).tokens
    for lp, ns, skipped in ((mean * 0.95, p * 0.95, True), (mean * 1.05, p * 0.95, False),
                            (mean * 0.95, p * 1.05, False)):
        kw = dict(logprob_threshold=lp, no_speech_threshold=ns, num_beams=beams)
        got = ours.transcribe(samples, language="en", max_new_tokens=N, **kw).tokens
        want = _generate(theirs, features, temperature=0.0, **kw)[0].tolist()  # (None fails)
        assert got == want and (got == []) == skipped and (got or plain) == plain, kw


@pytest.fixture(scope="module")
def long_audio(built):
    _, _, samples, _ = built
    return np.concatenate([samples, np.zeros(30 * 16_000, np.float32), samples])


def test_condition_on_prev_tokens_as_transformers(built, long_audio):
    """Long-form audio (speech, 30 s of silence, speech) with condition_on_prev_tokens, greedy,
    and with a prompt: tokens equal transformers' generate; conditioning changes them (so the
    comparison reads it)."""
    theirs, ours, _, _ = built
    features = log_mel(long_audio, 80, whole=True)
    plain = ours.transcribe(long_audio, language="en", max_new_tokens=N).tokens
    ids = ours.tokenizer.hf.encode(" Fox, dog.", add_special_tokens=False).ids
    for prompt in (None, "Fox, dog."):
        got = ours.transcribe(long_audio, language="en", max_new_tokens=N, prompt=prompt,
                              condition_on_prev_tokens=True).tokens
        extra = {} if prompt is None else {
            "prompt_ids": torch.tensor([ours.tokens["previous"], *ids])}
        want = _generate(theirs, features, return_timestamps=True,
                         condition_on_prev_tokens=True, **extra)[0].tolist()
        assert got == want, prompt
    assert got != plain


def test_every_window_falls_back_to_the_last_temperature(built, long_audio, monkeypatch):
    """compression_ratio_threshold 0 fails every attempt: each window tries 0.0, 0.2, 0.6 and
    keeps the 0.6 sample, which is the seeded sampling at 0.6 alone (each attempt draws from
    its own generator of `seed`); conditioning stops after a window kept at >= 0.5. With a
    threshold no window fails, the greedy tokens of a single temperature."""
    _, ours, _, _ = built
    tried: list[float] = []
    real = ours._run_settings
    monkeypatch.setattr(ours, "_run_settings",
                        lambda begin, run, t: (tried.append(t), real(begin, run, t))[1])
    got = ours.transcribe(long_audio, language="en", max_new_tokens=N, seed=5,
                          temperature=(0.0, 0.2, 0.6), compression_ratio_threshold=0.0,
                          condition_on_prev_tokens=True)
    windows = len(tried) // 3
    assert windows >= 2 and tried == [0.0, 0.2, 0.6] * windows
    tried.clear()
    alone = ours.transcribe(long_audio, language="en", max_new_tokens=N, seed=5,
                            temperature=0.6)
    assert got.tokens == alone.tokens and tried == [0.6] * windows
    passing = ours.transcribe(long_audio, language="en", max_new_tokens=N,
                              temperature=(0.0, 0.2), compression_ratio_threshold=100.0,
                              logprob_threshold=-100.0)
    assert passing.tokens == ours.transcribe(long_audio, language="en",
                                             max_new_tokens=N).tokens


@pytest.mark.parametrize("kw, says", [
    (dict(temperature=()), "temperature=() is invalid: a number >= 0, or a list"),
    (dict(temperature=(0.0, -0.2)), "temperature=(0.0, -0.2) is invalid"),
    (dict(compression_ratio_threshold="high"), "compression_ratio_threshold='high' is invalid"),
    (dict(no_speech_threshold=0.6), "no_speech_threshold=0.6 needs logprob_threshold"),
    (dict(condition_on_prev_tokens=1), "condition_on_prev_tokens=1 is invalid: True or False"),
    (dict(temperature=(0.2, 0.4), num_beams=2), "beam search here is deterministic"),
])
def test_bad_fallback_arguments_are_refused_by_name(kw, says, built):
    _, ours, samples, _ = built
    with pytest.raises(ConfigError, match=re.escape(says)):
        ours.transcribe(samples, language="en", **kw)


def test_tinyt_transcribe_takes_the_fallback_options(built, long_audio, tmp_path, monkeypatch,
                                                     capsys):
    """`tinyt transcribe --temperature 0,0.6 --compression-ratio-threshold 0 --seed 5
    --condition-on-prev-tokens` prints transcribe's answer for the same keywords; no-speech
    thresholds that skip every window print an empty text; a bad --temperature exits 2."""
    import json

    import soundfile

    _, ours, _, artifact = built
    wav = tmp_path / "long.wav"
    soundfile.write(str(wav), long_audio, 16_000, subtype="FLOAT")
    common = [artifact, wav, "--language", "en", "--max-new-tokens", N, "--threads", 1]
    code, out, _ = run_cli(monkeypatch, capsys, "transcribe", *common, "--format", "json",
                           "--temperature", "0,0.6", "--compression-ratio-threshold", 0,
                           "--seed", 5, "--condition-on-prev-tokens")
    want = ours.transcribe(long_audio, language="en", max_new_tokens=N, seed=5,
                           temperature=(0.0, 0.6), compression_ratio_threshold=0.0,
                           condition_on_prev_tokens=True)
    assert code in (0, None) and json.loads(out) == json.loads(json.dumps(want.to_dict()))
    code, out, _ = run_cli(monkeypatch, capsys, "transcribe", *common, "--logprob-threshold",
                           0, "--no-speech-threshold", 0)
    assert code in (0, None) and out == "\n"  # every window skipped: no text
    code, _, err = run_cli(monkeypatch, capsys, "transcribe", *common, "--temperature", "0,hot")
    assert code == 2 and "--temperature '0,hot' is invalid: a number, or comma-separated" in err
