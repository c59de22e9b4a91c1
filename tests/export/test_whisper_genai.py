"""`tinyt package WHISPER --format genai` (export/genai_whisper.py): ONNX Runtime GenAI's Whisper
(onnxruntime-genai, `model.type` "whisper") loads the package unchanged and, on espeak-ng's
speech (the synthetic voice without it), gives tinyt.runtime's greedy tokens with tinyt's
weights: fp32, INT8 and INT4 (tests/conftest.py's small_whisper). The encoder with the cross
caches returns what the source's encoder and first decoder graph return; what does not apply
is refused by name. An optimized artifact's stepping graph (cross attention grouped by window)
runs fed a cache a row, as GenAI feeds it. Fed a WAV, GenAI's own front end (the package's
audio_processor_config.json) gives transformers' features and tinyt.runtime's transcribe
tokens on the same file."""
from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from whisper_fixtures import speech_features

import tinyt.runtime as rt
from tinyt.errors import PackageError
from tinyt.export.package import package
from tinyt.export.web.speech_page import speech_ties

og = pytest.importorskip("onnxruntime_genai", reason="pip install 'tinyt[peers]'")
from tinyt.export import genai_whisper as gw  # noqa: E402
from tinyt.export.genai_whisper import FILES, genai_generate  # noqa: E402

NEW_TOKENS = 24
# The composed encoder runs the source's own nodes on the same inputs: ONNX Runtime may fuse
# them otherwise, so fp32 reordering at most — 1e-5 of outputs of magnitude ~1-10 (64 wide,
# 1 layer; compare.reorder_bound's arithmetic gives ~1e-5 here).
ENCODER_TOL = 1e-5
# GenAI's log-mel against transformers' WhisperFeatureExtractor on the same 16-bit samples: two
# float32 FFTs of 400 samples and mel sums (relative error ~1e-6 in the power), through
# log10 / 4: ~1e-6 where the power is large, up to ~1e-5 in quiet bins near the floor 8 below
# the maximum; 1e-4 leaves room (measured: 2.3e-5, tinyt's log_mel the same).
FRONT_END_TOL = 1e-4


def _features(n_mels: int) -> np.ndarray:
    feats = speech_features(n_mels)
    if feats is None:  # no espeak-ng: the package check's synthetic voice
        from tinyt.export.speech_accuracy import voice
        from tinyt.runtime.audio import log_mel
        feats = log_mel(voice(), n_mels=n_mels)
    return feats


@pytest.fixture(scope="module")
def sources(small_whisper, tmp_path_factory) -> dict:
    """The fixture's fp32, INT8, INT4 and, optimized, "opt" (its stepping graph's cross
    attention grouped by window: export/cross_groups.py)."""
    from tinyt.export.optimize import optimize

    root = tmp_path_factory.mktemp("genai-opt")
    return {**{v: small_whisper[v] for v in ("fp32", "int8", "int4")},
            "opt": optimize(small_whisper["fp32"], root / "opt")}


@pytest.fixture(scope="module")
def genai_packages(sources, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("genai")
    return {v: package(src, root / v, format="genai") for v, src in sources.items()}


@pytest.mark.parametrize("variant", ["fp32", "opt", "int8", "int4"])
def test_genai_tokens_equal_tinyt(genai_packages, sources, variant):
    out = genai_packages[variant]
    cfg = json.loads((out / "genai_config.json").read_text())
    assert cfg["model"]["type"] == "whisper"
    assert cfg["model"]["encoder"]["filename"] == FILES["encoder"]
    assert (out / gw.PROCESSOR).is_file()
    checked = out.manifest["equivalence"]["greedy"]
    quantized = variant.startswith("int")
    assert checked["equal"] is True or (quantized and checked["ties"] == 1)
    assert checked["wav_equal"] is True or (quantized and checked["wav_ties"] == 1)
    asr = rt.load(sources[variant], threads=1, tune=False)
    feats = _features(asr.n_mels)
    want = asr.decode_features(feats[None], language="en", max_new_tokens=NEW_TOKENS)[0]
    model = og.Model(str(out))
    prompt = asr._prefix("en", "transcribe", False)
    got = genai_generate(model, feats[None], prompt, NEW_TOKENS, eos=asr.eos,
                         suppress=asr.suppress, begin_suppress=asr.begin_suppress)[0]
    if not quantized or got == want:
        assert got == want, f"{variant}: GenAI {got} != tinyt {want}"
    else:  # the prompt through the stepping graph's int8 recipe: a tie of tinyt's logits
        assert speech_ties(asr, [feats], [got], "en", new_tokens=NEW_TOKENS) == 1
    assert len(want) >= 8
    # the rules reach GenAI's search: suppressing the first token tinyt chose moves GenAI's
    moved = genai_generate(model, feats[None], prompt, 2, eos=asr.eos, suppress=asr.suppress,
                           begin_suppress=list(asr.begin_suppress) + [want[0]])[0]
    assert moved[0] != want[0]


def test_genai_transcribes_a_wav(genai_packages, sources, tmp_path):
    """espeak-ng's speech at 16 kHz in a 16-bit WAV: GenAI's front end makes transformers'
    features of it, and GenAI's greedy tokens from the file are tinyt.runtime's transcribe
    tokens on the same file."""
    import shutil
    import subprocess
    import wave

    from transformers import WhisperFeatureExtractor

    from tinyt.runtime.audio import load_audio

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (scripts/setup.sh)")
    said = tmp_path / "said.wav"
    subprocess.run(["espeak-ng", "-w", str(said), "The quick brown fox jumps over the lazy "
                    "dog."], check=True, timeout=60)
    pcm = np.round(load_audio(said) * 32767).astype("<i2")  # espeak's 22,050 Hz, soxr'd
    wav = tmp_path / "16k.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16_000)
        w.writeframes(pcm.tobytes())
    model = og.Model(str(genai_packages["fp32"]))
    processor = model.create_multimodal_processor()
    feeds = processor("<|startoftranscript|>", audios=og.Audios.open(str(wav)))
    got = feeds["audio_features"].as_numpy()
    want = WhisperFeatureExtractor(feature_size=80)(
        pcm / 32768, sampling_rate=16_000, return_tensors="np").input_features
    assert got.shape == want.shape == (1, 80, 3000) and got.dtype == np.float32
    assert np.abs(got - want).max() <= FRONT_END_TOL
    asr = rt.load(sources["fp32"], threads=1, tune=False)
    ours = asr.transcribe(wav, language="en", max_new_tokens=NEW_TOKENS).tokens
    theirs = gw.genai_transcribe(model, wav, asr._prefix("en", "transcribe", False), NEW_TOKENS,
                              eos=asr.eos, processor=processor, suppress=asr.suppress,
                              begin_suppress=asr.begin_suppress)
    assert theirs == ours and len(ours) >= 8
    assert gw.genai_transcribe(model, wav.read_bytes(), asr._prefix("en", "transcribe", False),
                            NEW_TOKENS, eos=asr.eos, suppress=asr.suppress,
                            begin_suppress=asr.begin_suppress) == ours


def test_encoder_returns_the_cross_caches(genai_packages, small_whisper):
    src, out = small_whisper["fp32"], genai_packages["fp32"]
    feats = _features(80)[None].astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    run = {f: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
           for f, p in (("enc", src / "encoder_model.onnx"), ("dec", src / "decoder_model.onnx"),
                        ("new", out / FILES["encoder"]))}
    hidden = run["enc"].run(None, {"input_features": feats})[0]
    names = [o.name for o in run["dec"].get_outputs() if ".encoder." in o.name]
    cross = run["dec"].run(names, {"input_ids": np.array([[50258]], np.int64),
                                   "encoder_hidden_states": hidden})
    got = dict(zip([o.name for o in run["new"].get_outputs()],
                   run["new"].run(None, {"input_features": feats})))
    assert set(got) == {"last_hidden_state", *names}
    for name, want in zip(["last_hidden_state", *names], [hidden, *cross]):
        assert got[name].shape == want.shape, name
        assert np.abs(got[name] - want).max() <= ENCODER_TOL * max(1.0, np.abs(want).max()), name


def test_genai_refusals(lm_onnx, tmp_path):
    from seq2seq_fixtures import seq2seq_artifact

    with pytest.raises(PackageError, match="not a Whisper artifact.*genai_config.json already"):
        package(lm_onnx, tmp_path / "x", format="genai")
    _, text = seq2seq_artifact(tmp_path / "text")
    with pytest.raises(PackageError, match="text encoder-decoder.*runs no other"):
        package(text, tmp_path / "y", format="genai")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_cli_packages_a_whisper_for_genai(small_whisper, tmp_path):
    from conftest import run_tinyt

    r = run_tinyt("package", str(small_whisper["int8"]), str(tmp_path / "g"), "--format",
                  "genai")
    assert r.returncode == 0, r.stderr
    assert "greedy tokens as tinyt's" in r.stdout
    assert {"encoder.onnx", "decoder.onnx", "genai_config.json"} <= {
        p.name for p in (tmp_path / "g").iterdir()}
