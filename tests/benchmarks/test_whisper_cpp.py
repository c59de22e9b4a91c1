"""whisper.cpp in the Whisper peer benchmark (benchmarks/peers/whisper_cpp.py), opt-in: skipped
with the setup command unless pywhispercpp and whisper.cpp's converter are here (bash
scripts/setup-whisper-cpp.sh). On the peer test's Whisper (tiny's widths and vocabulary, 1 + 1
layers, peer_whisper's random weights) and espeak-ng speech:

- whisper.cpp's own converter's f16 file, flash attention off, gives tinyt fp32's greedy tokens
  on the same features, but where tinyt suppresses one of the generation config's
  suppress_tokens that whisper.cpp does not: whisper.cpp finds them by their text
  (suppress_nst), and this random Whisper's ordinary tokens are filler pieces, not the real
  vocabulary's punctuation. Its weights rounded to fp16 move these logits by ~1e-3, far below
  the gaps between their first two tokens. With flash attention (its default) and at q8_0 it
  reports its agreement; all three are timed;
- its own log-mel front end (16-kHz samples in) gives the tokens it gives on tinyt's features
  of the same samples (the bindings return no features to compare number by number);
- the converter refuses an option it has no file for, naming the ones it has.
Nothing here asserts a time."""
import shutil
import subprocess

import numpy as np
import pytest

from tinyt.benchmarks.peers import whisper_cpp
from tinyt.benchmarks.peers import whisper_peers as bench
from tinyt.benchmarks.whisper_shape import peer_whisper
from tinyt.errors import BenchError

SMALL = dict(encoder_layers=1, decoder_layers=1)  # the peer test's Whisper
CALLS = dict(check_windows=3, new_tokens=6, batch=2, beams=2)
ROWS = ("whisper.cpp-f16", "whisper.cpp-f16-fa", "whisper.cpp-q8_0")
WHY = whisper_cpp.missing()
pytestmark = [
    pytest.mark.skipif(WHY is not None, reason=f"{WHY}: opt-in"),
    pytest.mark.skipif(shutil.which("espeak-ng") is None,
                       reason="espeak-ng is not installed (scripts/setup.sh)")]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper-cpp")
    peer_whisper("tiny", root / "hf", **SMALL)
    bench.make("tiny", root, log=lambda _: None, rows=("onnx",))
    return root


@pytest.fixture(scope="module")
def result(artifacts):
    r = bench.run(artifacts, artifacts / "out", threads=[1], rounds=1, block=1, settle=0,
                  engines=["tinyt-fp32", *ROWS], **CALLS, log=lambda _: None)
    return r


@pytest.mark.slow  # conversions, four workers, one round: ~4 min on 2 loaded cores
def test_whisper_cpp_rows_are_checked_and_timed(result):
    a = result["agreement"]
    assert all(a[name]["must_equal"] is None for name in ROWS)  # none fp32: told
    timed = set(result["rows"])  # "engine@threads", each with its medians
    assert {"whisper.cpp-f16@1t", "whisper.cpp-f16-fa@1t"} <= timed
    assert all(result["rows"][label]["greedy_ms"] > 0 for label in timed)
    made = result["made"]["whisper.cpp-f16@1t"]  # exactly the tokens asked, every call
    clip = result["method"]["clip"]["n"]  # the 5-s clip through its own front end
    assert made == [CALLS["new_tokens"], CALLS["new_tokens"],
                    CALLS["new_tokens"] * CALLS["batch"], clip, 0]
    row = result["rows"]["whisper.cpp-f16@1t"]
    assert 0 < row["clip_features_ms"] < row["clip_ms"]  # whisper_pcm_to_mel, then all of it
    said = a["whisper.cpp-f16"]["clip"]  # its tokens told; its features kept in its context
    assert said["tokens"] == clip and said["features_vs_log_mel"] is None
    if whisper_cpp.quantizer() is None:
        assert "setup-whisper-cpp.sh" in result["skipped"]["whisper.cpp-q8_0"]
    else:
        assert "whisper.cpp-q8_0@1t" in timed
        assert 0.0 <= a["whisper.cpp-q8_0"]["greedy"]["agreement"] <= 1.0


@pytest.mark.slow
def test_f16_gives_tinyts_tokens_but_where_tinyt_suppresses(artifacts, result):
    import json

    import tinyt.runtime as rt

    path = artifacts / "out" / "features.npy"
    windows = np.load(path, allow_pickle=False)
    suppressed = set(json.loads((artifacts / "hf" / "generation_config.json").read_text())[
        "suppress_tokens"])
    ours = rt.load(artifacts / "onnx", threads=1)
    theirs = whisper_cpp.load(artifacts / "peers" / "whisper.cpp-f16", 1, features=str(path))
    n, parted = 16, 0
    for k in range(len(windows)):
        want = ours.decode_features(windows[k:k + 1], language="en", max_new_tokens=n)[0]
        got = theirs([k], n, 1)[0]
        assert len(got) == n
        if got != want:  # the first parting: whisper.cpp's pick is one tinyt suppresses
            at = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
            assert got[at] in suppressed and want[at] not in suppressed, (k, at, got, want)
            parted += 1
    assert parted < len(windows)  # at least one window the same all along


@pytest.mark.slow
def test_its_own_front_end_gives_the_tokens_of_tinyts_features(artifacts, result, tmp_path):
    from tinyt.runtime.audio import load_audio, log_mel

    features = np.load(artifacts / "out" / "features.npy", allow_pickle=False)
    model = whisper_cpp.load(artifacts / "peers" / "whisper.cpp-f16", 1,
                             features=str(artifacts / "out" / "features.npy"))
    for k, said in enumerate(("Whisper reads thirty seconds at a time.",
                              "The quick brown fox jumps over the lazy dog.")):
        wav = tmp_path / f"{k}.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), said], check=True, timeout=60)
        samples = load_audio(wav)
        ours = log_mel(samples, n_mels=features.shape[1])
        np.save(tmp_path / "one.npy", ours[None], allow_pickle=False)
        on_ours = whisper_cpp.load(artifacts / "peers" / "whisper.cpp-f16", 1,
                                   features=str(tmp_path / "one.npy"))([0], 8, 1)[0]
        assert model.from_samples(samples, 8) == on_ours
        assert len(on_ours) == 8


def test_the_converter_refuses_an_option_without_a_file(tmp_path):
    with pytest.raises(BenchError, match=r"'f32': f16 or q8_0"):
        whisper_cpp.convert(tmp_path / "hf", tmp_path / "out", "f32")
