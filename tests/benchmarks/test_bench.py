"""The benchmark harness on tiny artifacts: every variant measured on every shape, figures
consistent, targets computed from the run itself."""
import json
import shutil
from pathlib import Path

import pytest

from tinyt.benchmarks import harness
from tinyt.export.quantize import quantize


@pytest.fixture(scope="module")
def artifacts(tiny_ckpt, lm_onnx, tiny_clf, corpus_dir, tmp_path_factory):
    from tinyt.export import export_onnx
    root = tmp_path_factory.mktemp("artifacts")
    shutil.copytree(tiny_ckpt, root / "checkpoint")
    shutil.copytree(lm_onnx, root / "onnx")
    quantize(lm_onnx, root / "onnx-int8", data=str(corpus_dir))
    shutil.copytree(tiny_clf, root / "clf")
    export_onnx(tiny_clf, root / "clf-onnx")
    return root


def test_measure_settles_then_times_blocks_interleaved():
    calls: list[str] = []
    times = harness.measure({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                            rounds=2, warmup=1, block=3, settle=2)
    assert {k: len(v) for k, v in times.items()} == {"a": 6, "b": 6}
    assert "".join(calls) == "a" + "b" + ("a" * 5 + "b" * 5) * 2


@pytest.mark.slow
def test_quick_run(artifacts, tmp_path, monkeypatch):
    monkeypatch.setitem(harness.MODES, "quick", {**harness.MODES["quick"], "rounds": 2,
                                                 "block": 2, "warmup": 1})
    result = harness.run(artifacts, tmp_path / "out", mode="quick")
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["mode"] == "quick" and saved["environment"]["versions"]["onnxruntime"]
    names = {r["variant"].split("@")[0] for r in saved["rows"] if r["kind"] != "classify"}
    assert names == {"torch-fp32-kv", "torch-fp32-nocache", "torch-int8-dynamic-kv", "ort-fp32",
                     "ort-int8-dynamic", harness.BASELINE}
    assert {r["kind"] for r in saved["rows"]} == {"decode", "prefill", "classify"}
    clf = [r for r in saved["rows"] if r["kind"] == "classify"]
    assert {r["variant"].split("@")[0] for r in clf} == {"torch-clf-fp32", "ort-clf-fp32"}
    for r in clf:
        assert r["batch"] == 8 and r["sequences_per_s"] == pytest.approx(8e3 / r["p50_ms"])
    for r in saved["rows"]:
        assert len(r["times_s"]) == 4
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
    for name in ("decode_int8_vs_torch_kv", "decode_int8_vs_plain_int8",
                 "prefill_best_ort_vs_torch", "int8_size_vs_fp32_max"):
        assert result["targets"][name]["measured"] > 0
    fp = saved["footprint"]
    assert set(fp) == {"torch-fp32", "ort-fp32", "ort-int8-dynamic", harness.BASELINE}
    for name, f in fp.items():
        assert "error" not in f, (name, f)
        assert f["load_s"] > 0 and f["first_call_ms"] > 0 and f["peak_rss_bytes"] > 10 * 2**20
    assert fp["torch-fp32"]["peak_rss_bytes"] > fp["ort-int8-dynamic"]["peak_rss_bytes"]
    md = (tmp_path / "out" / "results.md").read_text()
    assert "peak RSS MiB" in md
    assert saved["accuracy_change"]["ort-fp32"] == 0.0
    assert saved["accuracy_change"]["ort-int8-dynamic"] <= 0.02
    for png in ("latency_vs_prompt.png", "decode_tokens_per_s.png", "size_vs_loss.png"):
        data = (tmp_path / "out" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
    assert "| ort-int8-dynamic@" in md and "decode_int8_vs_torch_kv" in md
    assert "| ort-clf-fp32@" in md and "sequences/s" in md


def test_load_cost_measures_the_runtime_as_a_user_loads_it(lm_onnx):
    """rt.load in a fresh process: its load time, the memory after it and the load's own
    peak (a tuner's sessions show there), then the calls' peak."""
    from tinyt.benchmarks.load_cost import measure_in_subprocess

    m = measure_in_subprocess("runtime", lm_onnx, 1)
    assert "error" not in m, m
    assert m["load_s"] > 0 and m["first_call_ms"] > 0
    assert 10 * 2**20 < m["rss_after_load_bytes"] <= m["load_peak_rss_bytes"] \
        <= m["peak_rss_bytes"]
    assert measure_in_subprocess("nothing", lm_onnx, 1)["error"]


def test_bad_mode(artifacts, tmp_path):
    with pytest.raises(ValueError, match="mode='fast' is not one of quick, full"):
        harness.run(artifacts, tmp_path / "x", mode="fast")
    with pytest.raises(ValueError, match="rounds=0 must be an integer >= 1"):
        harness.run(artifacts, tmp_path / "x", rounds=0)


def test_bench_cli_refuses_bad_options_in_one_line(artifacts, tmp_path, monkeypatch):
    from conftest import run_tinyt
    for args, says in ((["--mode", "x"], "error: --mode x is not one of quick, full"),
                       (["--rounds", "0"], "error: --rounds 0 times nothing")):
        proc = run_tinyt("bench", artifacts, "--out", tmp_path / "x", *args)
        assert proc.returncode == 2 and proc.stderr.startswith(says), proc.stderr
        assert "Traceback" not in proc.stderr and not (tmp_path / "x").exists()
    # --peers --rounds 0 is greedy agreement only: the 0 reaches the peer benchmark
    from typer.testing import CliRunner

    import tinyt.benchmarks.peers as peers
    from tinyt.app.cli import app
    asked = []

    def fake_run(artifacts, out, *, rounds):
        asked.append(rounds)
        out.mkdir(parents=True)
        (out / "peers.md").write_text("report")

    monkeypatch.setattr(peers, "run", fake_run)
    for args in ([], ["--rounds", "0"], ["--rounds", "3"]):
        result = CliRunner().invoke(app, ["bench", str(artifacts), "--peers", "--out",
                                          str(tmp_path / f"p{len(asked)}"), *args])
        assert result.exit_code == 0 and "report" in result.output, result.output
    assert asked == [8, 0, 3]


def test_gpu_script_stops_clearly_where_a_gpu_is_needed(artifacts, tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(["bash", str(root / "benchmarks/gpu.sh"), str(tmp_path / "none"),
                           sys.executable], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "run the main job first" in proc.stderr
    proc = subprocess.run(["bash", str(root / "benchmarks/gpu.sh"), str(artifacts),
                           sys.executable, str(tmp_path / "gpu")], capture_output=True,
                          text=True, timeout=120)  # never into the checkout's results
    import torch
    if torch.cuda.is_available():  # a GPU machine runs it for real
        assert proc.returncode == 0, proc.stderr
        assert json.loads((tmp_path / "gpu" / "results.json").read_text())["device"] == "cuda"
    else:
        assert proc.returncode == 2
        assert proc.stderr.strip() == ("error: device='cuda' needs a GPU that torch can see; "
                                       f"this machine has none (torch {torch.__version__}, "
                                       f"CUDA build: {torch.version.cuda})")


def test_device_checks():
    assert harness.check_device("cpu") == ["CPUExecutionProvider"]
    with pytest.raises(ValueError, match="device='tpu' is not one of cpu, cuda"):
        harness.check_device("tpu")


def test_full_mode_sizes_fit_a_small_model():
    from tinyt.config import ModelConfig
    cfg = ModelConfig(block_size=32, vocab_size=300, n_layer=1, n_head=2, n_embd=32)
    full = harness.MODES["full"]
    assert harness.resolve_sizes(full["pasts"], cfg, cfg.block_size - 1) == [31]  # not 32: 33 > 32
    assert harness.resolve_sizes(full["prompts"], cfg) == [1, 32]


@pytest.mark.slow
def test_plain_baseline_is_reused_while_current(artifacts, tmp_path):
    from tinyt.benchmarks.variants import plain_int8_baseline
    out = plain_int8_baseline(artifacts / "checkpoint", tmp_path / "baseline")
    stamp = (out / "model.onnx").stat().st_mtime_ns
    assert plain_int8_baseline(artifacts / "checkpoint", out) == out
    assert (out / "model.onnx").stat().st_mtime_ns == stamp  # reused, not rebuilt
    key = json.loads((out / "key.json").read_text())
    (out / "key.json").write_text(json.dumps({**key, "onnxruntime": "0.0"}))
    plain_int8_baseline(artifacts / "checkpoint", out)  # another onnxruntime: rebuilt
    assert json.loads((out / "key.json").read_text()) == key


# -- the encoder page against transformers.js (benchmarks/peers/browser_encoders.py) ---------
def _browser_tools() -> str | None:
    """Why the browser benchmark cannot run here, or None."""
    import shutil as sh

    from tinyt.errors import WebPackageError
    from tinyt.export.web import ort_web_dist, tokenizers_js_dist
    try:
        ort_web_dist(), tokenizers_js_dist()
    except WebPackageError as e:
        return str(e)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (extra 'web')"
    if not (sh.which("node") and (sh.which("chromium") or sh.which("chromium-browser"))):
        return "node or the system chromium is missing (bash scripts/setup-web.sh)"
    return None


NO_BROWSER = _browser_tools()
TJS = Path(__file__).resolve().parents[2] / "web" / "transformers-js" / "node_modules"


class _Stub:
    """An engine that returns the vectors it was given (check() on known numbers)."""

    def __init__(self, runner, variant, vectors):
        self.runner, self.variant, self.info, self._v = runner, variant, {}, vectors
        self.name = f"{runner}:{variant}"

    def vectors(self, texts):
        return self._v


def test_browser_encoder_check_refuses_an_fp32_engine_off_the_runtime_and_ratios(tmp_path):
    """fp32 engines must reach EXACT_COSINE on every text (INT8 reports); each row's time over
    the tinyt page's on the same graph and over the fastest tinyt page's; the report says it."""
    import numpy as np

    from tinyt.benchmarks.peers import browser_encoders as be
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(6, 8)).astype(np.float32)
    off = ref.copy()
    off[2] += 0.2 * np.linalg.norm(ref[2])  # one text's vector moved: cosine well under 0.9999
    got = be.check([_Stub("tinyt", "onnx", ref), _Stub("transformers.js", "onnx", off),
                    _Stub("tinyt", "int8", off)], ["t"] * 6, ref)
    assert got["tinyt:onnx"]["matches"] is True and got["tinyt:onnx"]["cosine_min"] > 0.99999
    assert got["transformers.js:onnx"]["matches"] is False
    assert got["transformers.js:onnx"]["cosine_min"] < be.EXACT_COSINE
    assert got["tinyt:int8"]["matches"] is None and not got["tinyt:int8"]["must_match"]
    assert got["tinyt:onnx"]["cosine_min_to_transformers.js:onnx"] == pytest.approx(
        got["transformers.js:onnx"]["cosine_min"], abs=1e-6)
    rows = [{"engine": e, "threads": 1, "call": "batch", "median_ms": ms} for e, ms in
            (("tinyt:onnx", 40.0), ("tinyt:int8-qgemm", 20.0), ("transformers.js:onnx", 50.0))]
    be.ratios(rows)
    tjs = rows[2]
    assert tjs["x_same_graph"] == pytest.approx(1.25) and tjs["x_tinyt_best"] == pytest.approx(2.5)
    assert tjs["tinyt_best"] == "tinyt:int8-qgemm"
    assert rows[0]["x_same_graph"] is None and rows[0]["x_tinyt_best"] == pytest.approx(2.0)
    with pytest.raises(be.BenchError, match=r"variants=\['fp16'\]: each one of onnx, opt"):
        be.run(None, tmp_path / "x", variants=("fp16",))
    with pytest.raises(be.BenchError, match="rounds=-1: an integer >= 0"):
        be.run(None, tmp_path / "x", rounds=-1)
    assert not (tmp_path / "x").exists()  # refused before anything is made


@pytest.mark.slow
@pytest.mark.skipif(NO_BROWSER is not None, reason=f"{NO_BROWSER}")
def test_browser_encoder_pages_check_then_time(tmp_path):
    """At the test shape, tinyt's pages (fp32, INT8 qgemm) give the runtime's vectors (fp32 at
    EXACT_COSINE) and are timed at both calls; results.json and results.md hold it."""
    from tinyt.benchmarks.peers import browser_encoders as be
    result = be.run(None, tmp_path / "out", shape="test", variants=("onnx", "int8-qgemm"),
                    threads=(1,), rounds=2, settle=0, block=1, check_texts=12, log=lambda s: None)
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["check"]["tinyt:onnx"]["matches"] is True
    assert saved["check"]["tinyt:int8-qgemm"]["cosine_min"] > 0.99  # INT8: reported
    assert {(r["engine"], r["call"]) for r in saved["rows"]} == {
        (e, c) for e in ("tinyt:onnx", "tinyt:int8-qgemm") for c in ("batch", "latency")}
    for r in saved["rows"]:
        assert len(r["times_ms"]) == 2 and r["median_ms"] > 0
        n = 32 if r["call"] == "batch" else 1
        assert r["texts_per_s"] == pytest.approx(1e3 * n / r["median_ms"])
    assert all(r["isolated"] and r["threads"] == 1 for r in saved["loads"])
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| tinyt:onnx | tinyt onnx | 1 |" in md and "transformers.js (not run)" in md
    assert result["environment"]["chromium"]


@pytest.mark.slow
@pytest.mark.skipif(NO_BROWSER is not None or not (TJS / "@huggingface" / "transformers").is_dir(),
                    reason=f"{NO_BROWSER or 'transformers.js is opt-in'}: bash "
                           "scripts/setup-transformers-js.sh")
def test_browser_encoder_against_transformers_js(tmp_path):
    """transformers.js' feature-extraction pipeline loads tinyt's fp32 graph (Optimum's names,
    the imported BertConfig) and gives tinyt.runtime's vectors and the page's, then both are
    timed in the same rounds; the ratio is its time over the page's."""
    from tinyt.benchmarks.peers import browser_encoders as be
    result = be.run(None, tmp_path / "out", shape="test", variants=("onnx",), threads=(1,),
                    rounds=1, settle=0, block=1, check_texts=12, transformers_js=TJS,
                    log=lambda s: None)
    check = result["check"]
    assert result["graphs"]["transformers.js:onnx"] == "tinyt onnx"  # not Optimum's fallback
    assert check["transformers.js:onnx"]["matches"] is True
    assert check["tinyt:onnx"]["cosine_min_to_transformers.js:onnx"] >= be.EXACT_COSINE
    tjs = [r for r in result["rows"] if r["engine"] == "transformers.js:onnx"]
    page = {r["call"]: r for r in result["rows"] if r["engine"] == "tinyt:onnx"}
    assert {r["call"] for r in tjs} == {"batch", "latency"}
    for r in tjs:
        assert r["x_same_graph"] == pytest.approx(r["median_ms"] / page[r["call"]]["median_ms"])
    assert result["environment"]["transformers_js"]
