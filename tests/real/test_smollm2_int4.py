"""INT4 calibrated on activations on the real SmolLM2-135M-Instruct (issue 51): `tinyt quantize
--bits 4 --block-size 64 --scheme symmetric --awq --max-mb 112` (blocks that do not align with
the Q4_1 blocks these weights were dequantized from), perplexity recomputed through
tinyt.runtime on held-out prose as tests/real/test_smollm2.py scores the INT8 artifacts.

Bound: PERPLEXITY_GOAL, issue 51's target at no more than 112 MB (the GenAI builder's
k_quant_mixed reaches +10.6% at 112 MB on the same weights); lab/int4_calibrated.py measured
+7.9% at 111.9 MB for this recipe (benchmarks/results/int4-calibrated-smollm2-135m-epyc-avx2).
Slow: import, export and optimize (~3.5 min on 2 cores) and the calibration (the scales'
search over 121 matmuls, then one fp32 pass of 256 tokens per weight table for its
sensitivity: 27-31 min on 2 shared cores) are far beyond a minute: the test passed in 39 min
here (2026-12-05, load average 9-12).
"""
import pytest

pytestmark = [pytest.mark.real, pytest.mark.slow]

PERPLEXITY_GOAL = 0.10  # at most +10% over fp32
MAX_BYTES = 112 * 10**6


@pytest.fixture(scope="module")
def smol_opt(smollm2_dir, tmp_path_factory):
    from .test_smollm2 import IN_CI
    if IN_CI:  # beside the suite, past CI's 90 minutes, as the main job on SmolLM2
        pytest.skip("calibrated INT4 on real SmolLM2 (~30 min on 2 cores) does not fit CI's 90 "
                    "minutes beside the suite: TINYT_REAL_MAIN_JOB=1 runs it (docs/testing.md)")
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("smollm2-int4")
    ck = import_hf(smollm2_dir, root / "ck", log=lambda s: None)
    return optimize(export_onnx(ck, root / "onnx"), root / "opt", target="cpu")


def test_calibrated_int4_within_the_goal_and_the_budget(smol_opt, tmp_path):
    import tinyt.runtime as rt
    from tinyt.benchmarks.real_quality import heldout_text
    from tinyt.export.quantize import quantize
    from tinyt.manifest import check_manifest

    from .test_smollm2 import _perplexity

    out = quantize(smol_opt, tmp_path / "int4", bits=4, block_size=64, scheme="symmetric",
                   awq=True, max_bytes=MAX_BYTES)
    q = check_manifest(out)["quantization"]
    assert q["bytes"] <= MAX_BYTES, q["bytes"]
    assert q["calibrated_4bit"]["mixed"]["kept_8bit"], q["calibrated_4bit"]["mixed"]
    tok = rt.load(smol_opt, threads=2, tune=False).tokenizer
    ids = tok.encode(heldout_text())
    windows = [ids[i * 500: i * 500 + 512] for i in range(4)]
    fp32 = _perplexity(smol_opt, windows)
    change = _perplexity(out, windows) / fp32 - 1
    assert change <= PERPLEXITY_GOAL, (change, fp32)
