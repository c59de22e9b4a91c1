"""lab/prefix_reuse.py at the tiny model's size: both engines give the same first token
every round (it raises otherwise), the held prefix is copied, and the report has the medians
and their ratio (a timing: reported, never asserted)."""
from lab.prefix_reuse import markdown, measure


def test_prefix_reuse_benchmark_runs_and_checks_its_tokens(lm_onnx, tmp_path):
    from tinyt.export.optimize import optimize

    gqa = optimize(optimize(lm_onnx, tmp_path / "opt"), tmp_path / "gqa", target="gqa")
    r = measure(gqa, prefix=20, suffix=4, rounds=3, threads=1)
    assert r["reused_tokens"] >= 3 * 20  # every timed round copied the held prefix
    assert len(r["ttft_ms"]["reuse"]) == len(r["ttft_ms"]["whole"]) == 3
    ratio = r["median_ms"]["whole"] / r["median_ms"]["reuse"]  # of the medians rounded to 0.01
    assert abs(r["speedup"] - ratio) <= 0.05 * ratio
    assert "| reuse |" in markdown(r)
