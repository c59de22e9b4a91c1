"""The real SmolLM2-135M-Instruct Q4_1 GGUF: tinyt's artifact of it (import-hf, export,
quantize --gguf-blocks, the blocks carried) against llama.cpp's own logits for the same file
and tokens (issue 51; benchmarks/gguf_llama_cpp.py). Opt-in: llama.cpp compiles from source
(scripts/setup-llama-cpp.sh); without it these skip, naming that command.

Bounds: llama.cpp does not compute the dequantized model. It quantizes each activation row to
8 bits in blocks of 32 (q8_1 beside Q4_1 weights, q8_0 beside Q8_0 and Q4_0) before every
product with a quantized matrix, and keeps the KV cache in f16; tinyt's weight-only graph
computes the dequantized weights in fp32. One q8 rounding moves an activation by up to half a
step, max|block| / 254: a product of 32·576 terms of both signs moves by ~1/254/sqrt(·) of its
size, and 30 layers (each norm, attention and MLP) carry it to the logits. What that gives is
measured (RESULT_*: benchmarks/results/gguf-llama-cpp-smollm2-epyc-vnni, AMD EPYC VNNI) and
the tests hold the measurement within 2x (another CPU's SIMD path rounds the same q8 blocks,
but sums them in another order)."""
from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.real, pytest.mark.slow]

# max over 165 positions of max |tinyt − llama.cpp| / max |llama.cpp's logits| (measured)
RESULT_WEIGHT_ONLY = None
RESULT_INT8 = None
TOP1 = None  # the least share of positions whose argmax is llama.cpp's (measured)


@pytest.fixture(scope="module")
def compared(smollm2_gguf, tmp_path_factory):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed: run `bash scripts/setup-llama-cpp.sh` "
                    "(opt-in: it compiles llama.cpp, ~20 min on 2 cores)")
    from benchmarks.gguf_llama_cpp import compare

    return compare(smollm2_gguf, tmp_path_factory.mktemp("lcpp"), threads=2)


def test_carried_blocks_compute_llama_cpps_logits(compared):
    from tinyt.checkpoint import load_checkpoint  # noqa: F401  (the import path is tinyt's)

    rows = compared["graphs"]
    assert set(rows) == {"fp32", "weight-only", "int8-activations"}
    assert compared["positions"] > 100
    # the carried blocks are the fp32 graph's weights: the same logits but for fp32 order
    assert rows["weight-only"]["vs_fp32_graph_max"] <= 1e-5
    assert rows["weight-only"]["vs_llama_cpp_max"] <= 2 * RESULT_WEIGHT_ONLY
    assert rows["int8-activations"]["vs_llama_cpp_max"] <= 2 * RESULT_INT8
    for g in rows.values():
        assert g["top1_equal_llama_cpp"] >= TOP1, g
