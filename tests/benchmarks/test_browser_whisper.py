"""Whisper's page against transformers.js' automatic-speech-recognition pipeline
(benchmarks/peers/browser_whisper.py) on the peer test's Whisper (tiny's widths and vocabulary,
1 + 1 layers, peer_whisper's random weights) and espeak-ng speech, in headless Chromium: every
page's tokens checked against tinyt.runtime's on that page's own features before one round is
timed (fp32: transformers.js' tokens are tinyt's page's; INT8 may part at a tie). Opt-in:
transformers.js (bash scripts/setup-transformers-js.sh), onnxruntime-web, chromium, playwright.
Without them only the refusal of bad options runs. Nothing here asserts a time."""
import shutil

import pytest
from test_bench import NO_BROWSER, TJS

from tinyt.benchmarks.peers import browser_whisper as bw
from tinyt.errors import BenchError

SMALL = dict(encoder_layers=1, decoder_layers=1)
NEEDS = pytest.mark.skipif(
    NO_BROWSER is not None or not (TJS / "@huggingface" / "transformers").is_dir()
    or shutil.which("espeak-ng") is None,
    reason=f"opt-in: {NO_BROWSER or 'transformers.js (bash scripts/setup-transformers-js.sh)'}"
           " and espeak-ng")


def test_bad_options_are_refused_together(tmp_path):
    with pytest.raises(BenchError) as e:
        bw.run(tmp_path, tmp_path / "out", None, variants=("onnx",), threads=(0,), rounds=-1)
    said = str(e.value)
    assert "rounds=-1: an integer >= 0" in said and "threads=[0]" in said
    assert f"{tmp_path / 'onnx'} holds no tinyt artifact" in said and "--make tiny" in said


@NEEDS
@pytest.mark.slow  # two packages each for two engines, four pages: ~8 min on 2 loaded cores
def test_pages_give_the_runtimes_tokens_then_are_timed(tmp_path):
    from tinyt.benchmarks.peers import whisper_peers
    from tinyt.benchmarks.whisper_shape import peer_whisper

    peer_whisper("tiny", tmp_path / "hf", **SMALL)
    whisper_peers.make("tiny", tmp_path, log=lambda _: None, rows=("onnx", "onnx-opt", "onnx-int8"))
    r = bw.run(tmp_path, tmp_path / "out", TJS, threads=(1,), rounds=1, settle=0, block=1,
               check_windows=2, new_tokens=6, log=lambda _: None)
    pages = ("tinyt:onnx", "tinyt:onnx-int8", "transformers.js:onnx", "transformers.js:onnx-int8")
    assert set(r["check"]) == set(pages) and not r["refused"], r["refused"]
    assert all(len(t) == 6 for c in r["check"].values() for t in c["tokens"])
    assert r["check"]["transformers.js:onnx"]["same_as_tinyt:onnx"] is True
    assert r["check"]["tinyt:onnx"]["ties"] == 0  # fp32 on these logits: no tie met
    assert {row["engine"] for row in r["rows"]} == set(pages)
    tjs = next(row for row in r["rows"] if row["engine"] == "transformers.js:onnx")
    assert tjs["x_same_graph"] == pytest.approx(tjs["median_ms"] / next(
        row["median_ms"] for row in r["rows"] if row["engine"] == "tinyt:onnx"))
    assert (tmp_path / "out" / "results.md").read_text().count("| checked |") == 4
