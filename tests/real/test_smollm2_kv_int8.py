"""The int8 KV cache on the real SmolLM2-135M-Instruct (issue 51): `tinyt optimize --target gqa
--kv-cache int8` (each channel's range of least squared int8 error, export/kv_int8.py) against
the float32-cache graph of the same weights, perplexity over its whole context (8,192 tokens)
on held-out prose (Python's pydoc topics), WINDOWS windows spread over the text, each run
through the cache in pieces of 512 tokens as chunked prefill and decode run
(benchmarks/kv_cache_bench.py quality).

Bound: GOAL, issue 51's, on the change of the perplexity over all the windows' tokens;
benchmarks/results/kv-int8-smollm2-epyc-vnni measured +0.0005% (windows: +0.005%, +0.16%,
+0.006%, -0.17%: the int8 cache's effect is within the spread between windows).
Slow: import, export, optimize and the two shared-cache stages (~6 min on 2 loaded cores),
then 2 x WINDOWS passes of 8,192 tokens (3-4 min each at 1 thread on 2 loaded cores): ~35
min; CI skips it as the main job on SmolLM2 (TINYT_REAL_MAIN_JOB=1 runs it:
`TINYT_REAL_MAIN_JOB=1 python -m pytest -q -n 0 tests/real/test_smollm2_kv_int8.py`).
"""
import numpy as np
import pytest

pytestmark = [pytest.mark.real, pytest.mark.slow]

GOAL = 0.005  # the int8 cache's perplexity at most +0.5% over the float32 cache's
WINDOWS = 4  # 8,192-token windows at 0, 34.9k, 69.8k and 104.9k of the 113,108 tokens
CONTEXT = 8192


@pytest.fixture(scope="module")
def smol_gqa(smollm2_dir, tmp_path_factory):
    from .test_smollm2 import IN_CI
    if IN_CI:  # beside the suite, past CI's 90 minutes, as the main job on SmolLM2
        pytest.skip("the int8 KV cache's perplexity on real SmolLM2 (~35 min on 2 cores) does "
                    "not fit CI's 90 minutes beside the suite: TINYT_REAL_MAIN_JOB=1 runs it "
                    "(docs/testing.md)")
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("smollm2-kv8")
    ck = import_hf(smollm2_dir, root / "ck", log=lambda s: None)
    opt = optimize(export_onnx(ck, root / "onnx"), root / "opt", target="cpu")
    return (optimize(opt, root / "gqa", target="gqa"),
            optimize(opt, root / "gqa8", target="gqa", kv_cache="int8"))


def test_int8_cache_within_half_a_percent_over_the_whole_context(smol_gqa):
    from tinyt.benchmarks.kv_cache_bench import quality
    from tinyt.manifest import check_manifest

    fp32, int8 = smol_gqa
    kv = check_manifest(int8)["kv_cache"]
    assert kv["clip"] == "mse" and kv["calibration"]["tokens"] == 4 * 2048
    res = quality(fp32, int8, CONTEXT, WINDOWS)
    changes = np.array(res["change_by_window"])
    assert res["change"] <= GOAL, (res["change"], changes)
    assert (changes != 0).all()  # the int8 cache moves every window's perplexity: it is int8
