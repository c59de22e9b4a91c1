"""The Whisper peer benchmark (benchmarks/peers/whisper_peers.py) at a test's size (Whisper's 80
mel bins, 51,865-token vocabulary and special ids; tiny's widths, 1 + 1 layers; peer_whisper's random
weights with the special rows of the head zero) on espeak-ng speech: the proof before any
timing — CTranslate2 float32 (faster-whisper's engine), Optimum's own speech export,
transformers' PyTorch model and ONNX Runtime GenAI on its model builder's fp32 build (where
scripts/setup-genai-builder.sh has run: ~15 s more, the build) give tinyt fp32's greedy tokens on the same log-mel features,
CTranslate2 int8 reports its agreement, and an engine running another model (the same shape,
another seed) is refused with the difference, never timed. The 5-s clip from its audio through
each engine's own front end: the fp32 engines' features within the FFT's rounding of tinyt's
log_mel and their tokens tinyt fp32's. One round is timed to see the results' rows; nothing
here asserts a time."""
import importlib.util
import json
import shutil
from dataclasses import replace

import pytest

from tinyt.benchmarks.peers import formats
from tinyt.benchmarks.peers import whisper_peers as bench
from tinyt.benchmarks.whisper_shape import peer_whisper, special_ids
from tinyt.errors import BenchError

PEERS = ("ct2-int8", "ct2-float32", "optimum-fp32", "transformers", "genai-builder-fp32")
EXACT = ("ct2-float32", "optimum-fp32", "transformers", "genai-builder-fp32")
# tiny's widths, 1 + 1 layers: at width 64 the three windows gave one output (the encoder's
# part too small to move the decoder's choices), a check that could not see the encoder
SMALL = dict(encoder_layers=1, decoder_layers=1)
CALLS = dict(check_windows=3, new_tokens=6, batch=2, beams=2)
# an fp32 front end's log-mel against runtime/audio.log_mel on the same samples: float32 FFTs
# of 400 samples and mel sums through log10 / 4, ~1e-5 in quiet bins (measured 2.7e-5:
# transformers', Optimum's, GenAI's); CTranslate2 takes log_mel's own (0)
FRONT_END_TOL = 1e-4
pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="espeak-ng is not installed (scripts/setup.sh)")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """ARTIFACTS as --make makes it (peer_whisper, then the pipeline's rows: import-hf,
    export, optimize, INT8), and CTranslate2's float32 conversion of another seed's model
    beside it (the engine that must be refused)."""
    root = tmp_path_factory.mktemp("whisper-peers")
    peer_whisper("tiny", root / "hf", **SMALL)
    # (hf/ is there: the rest is made; the rows the engines below time, INT4 not)
    bench.make("tiny", root, log=lambda _: None, rows=("onnx", "onnx-opt", "onnx-int8"))
    peer_whisper("tiny", root / "other-hf", seed=1, **SMALL)
    formats.ctranslate2(root / "other-hf", root / "peers" / "ct2-other", "float32")
    return root


@pytest.fixture(scope="module")
def result(artifacts):
    installed = [e for e in PEERS if importlib.util.find_spec(
        bench.WHISPER_ENGINES[e].modules[0].split(".")[0]) is not None
        and not (bench.WHISPER_ENGINES[e].missing or (lambda _: None))(False)]
    other = replace(bench.WHISPER_ENGINES["ct2-float32"], name="ct2-other",
                    artifact="peers/ct2-other", convert=None)
    out = artifacts / "out"
    r = bench.run(artifacts, out, threads=[1], rounds=1, block=1, settle=0,
                  engines=["tinyt-fp32", "tinyt-int8", *installed, other], **CALLS,
                  log=lambda _: None)
    return out, r, installed


@pytest.mark.slow  # the rows it times, conversions, workers: ~4 min on 2 loaded cores
def test_every_installed_fp32_engine_gives_tinyts_tokens(result):
    _, r, installed = result
    # the windows are different sentences and the tokens follow them: a check on one output
    # repeated would not see the encoder
    assert r["agreement"]["tinyt-fp32"]["greedy"]["distinct_outputs"] > 1
    for name in [e for e in EXACT if e in installed]:
        a = r["agreement"][name]
        assert a["must_equal"] == "tinyt-fp32" and a["greedy"]["identical"], (name, a)
        assert a["greedy"]["tokens"] == CALLS["check_windows"] * CALLS["new_tokens"]
        assert name not in r["skipped"]
        clip = a["clip"]  # from the clip's audio, each through its own front end
        assert clip["identical"] and clip["tokens"] == r["method"]["clip"]["n"], (name, clip)
        assert clip["features_vs_log_mel"] <= (0 if name.startswith("ct2") else FRONT_END_TOL)
    assert r["agreement"]["tinyt-fp32"]["clip"]["features_vs_log_mel"] == 0
    if "ct2-int8" in installed:  # reported, never refused
        a = r["agreement"]["ct2-int8"]
        assert a["must_equal"] is None and 0.0 <= a["greedy"]["agreement"] <= 1.0
        assert "ct2-int8" not in r["skipped"]


@pytest.mark.slow
def test_an_engine_running_another_model_is_refused_before_timing(result):
    out, r, _ = result
    said = r["skipped"]["ct2-other"]
    assert said.startswith("refused before timing: its greedy tokens differ from tinyt-fp32's")
    parted = r["agreement"]["ct2-other"]["greedy"]["ties"]
    assert parted and all(t["margin"] > t["tie_bound"] for t in parted)
    assert not any(k.startswith("ct2-other@") for k in (*r["rows"], *r["raw_s"]))
    assert "**refused**" in (out / "results.md").read_text()


@pytest.mark.slow
def test_results_hold_a_row_per_timed_engine_and_every_token_asked(result):
    out, r, installed = result
    assert set(r["rows"]) == {f"{e}@1t" for e in ("tinyt-fp32", "tinyt-int8", *installed)}
    n = CALLS["new_tokens"]  # peer_whisper's zero end row: every engine makes every token
    clip = r["method"]["clip"]  # 14 words, a comma, a full stop: 16 tokens
    assert clip["n"] == 16 and clip["seconds"] == 5 and 4 < clip["speech_s"] <= 5
    for label, row in r["rows"].items():
        assert r["made"][label] == [n, n, CALLS["batch"] * n, clip["n"], 0], label
        assert row["clip_ms"] > 0 and 0 < row["clip_features_ms"] < row["clip_ms"], label
    a = r["agreement"]["tinyt-int8"]  # INT8: its agreement reported, its times taken
    assert a["must_equal"] is None and 0.0 <= a["greedy"]["agreement"] <= 1.0
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == r["rows"] and len(saved["environment"]["load_average"]["before"]) == 3
    md = (out / "results.md").read_text()
    assert "# Whisper: tinyt vs peers" in md and "1 window greedy ms" in md
    assert "5-s clip, audio to text ms" in md and clip["text"] in md
    if "ct2-int8" in installed:
        # tinyt's best of its timed rows (which one is the timing's call, not the test's)
        assert r["targets"]["greedy_ms@1t"]["tinyt"] in ("tinyt-fp32", "tinyt-int8")
        assert "× CTranslate2 int8" in md
        assert r["targets"]["clip_ms@1t"]["tinyt"] in ("tinyt-fp32", "tinyt-int8")


def test_peer_whisper_zeroes_the_special_rows_no_prompt_reads(tmp_path):
    model = peer_whisper("tiny", tmp_path / "hf", **SMALL)
    ids = special_ids(model.config.vocab_size)
    head = model.get_output_embeddings().weight
    prompt = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")
    for name, i in ids.items():
        assert bool((head[i] == 0).all()) == (name not in prompt), name
    assert bool((head[:50257].abs().sum(dim=1) > 0).all())  # the ordinary rows drawn


def test_unknown_engine_and_bad_settings_are_refused_before_any_work(tmp_path):
    with pytest.raises(BenchError, match="unknown engine.*faster"):
        bench.run(tmp_path, tmp_path / "out", engines=["faster"])
    with pytest.raises(BenchError) as e:
        bench.run(tmp_path, tmp_path / "out", beams=1, new_tokens=0, threads=[0],
                  measures=["clip", "latency"])
    for said in ("beams=1", "new_tokens=0", "threads=[0]", "holds no Whisper",
                 "measures=['clip', 'latency']: some of greedy, beam, batch, clip"):
        assert said in str(e.value)
    assert not (tmp_path / "out").exists()


def test_a_busy_machine_is_said_in_the_report():
    busy = {"load_average": {"before": [3.0, 2.5, 2.0]}, "physical_cores": 2}
    assert "**Under load**: a 1-min load average of 3.0 on 2" in bench._load(busy)[0]
    assert bench._load({"load_average": {"before": [0.4, 1, 1]}, "physical_cores": 2}) == []
