"""GGUF blocks carried into MatMulNBits (issue 51): `tinyt quantize --gguf-blocks` on a GGUF
import takes its Q4_0 / Q4_1 / Q8_0 blocks as they are (export/gguf_blocks.py).

Bounds: a carried table reads back (ONNX Runtime's MatMulNBits, and the module's own
dequantize_table) as gguf's fp32 dequantization bit for bit for Q4_0 and Q8_0; for Q4_1 bit
for bit in every block whose float zero point z has fl(z·d) = -m (~92% of SmolLM2's blocks),
the others one fp32 rounding of m away. The weight-only artifact against the fp32 export of
the same checkpoint: both multiply the same fp32 weights, so logits differ by the order of
sums alone (compare.reorder_bound; measured 2e-6 here), where the recipe's own 4-bit
quantization of the same weights moves them by ~1e-2."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from gguf_fixtures import write_gguf

from tinyt.errors import QuantizeError
from tinyt.export.gguf_blocks import BITS, dequantize_table, nbits_table

gguf = pytest.importorskip("gguf")


def _raw(kind: str, N: int = 48, K: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGUF rows, gguf's fp32 dequantization) of a random [N, K] matrix in `kind`."""
    w = (np.random.default_rng(seed).standard_normal((N, K)) * 0.05).astype(np.float32)
    w[0, :32] = 0  # a block of zeros: scale 0
    qtype = gguf.GGMLQuantizationType[kind]
    raw = gguf.quants.quantize(w, qtype)
    return raw, gguf.quants.dequantize(raw, qtype)


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q4_1"])
def test_tables_dequantize_to_gguf_values(kind):
    raw, want = _raw(kind)
    table = nbits_table(kind, raw)
    got = dequantize_table(table)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert table.bits == BITS[kind] and table.scales.shape == (48, 3)
    if kind != "Q4_1":
        assert table.zero_points is None and table.inexact_blocks == 0
        assert np.array_equal(got, want), float(np.abs(got - want).max())
        return
    exact = (got == want).reshape(48, 3, 32).all(-1)
    assert (~exact).sum() <= table.inexact_blocks < 0.2 * exact.size
    m = np.abs(want).max()
    assert float(np.abs(got - want).max()) <= 2.0 ** -23 * m  # one rounding of |m| <= max


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0", "Q4_1"])
def test_onnx_runtime_reads_the_table_as_dequantize_table(kind):
    """MatMulNBits (fp32 products) of the identity returns the weights it dequantized."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    raw, _ = _raw(kind, seed=1)
    t = nbits_table(kind, raw)
    N, K = raw.shape[0], t.scales.shape[1] * 32
    inits = [numpy_helper.from_array(t.packed, "B"), numpy_helper.from_array(t.scales, "s")]
    if t.zero_points is not None:
        inits.append(numpy_helper.from_array(t.zero_points, "z"))
    node = helper.make_node("MatMulNBits", ["x", "B", "s", *(["z"] if len(inits) == 3 else [])],
                            ["y"], domain="com.microsoft", K=K, N=N, bits=t.bits, block_size=32,
                            accuracy_level=0)
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    read = session.run(None, {"x": np.eye(K, dtype=np.float32)})[0].T
    assert np.array_equal(read, dequantize_table(t))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from tinyt.export import export_onnx
    from tinyt.hf import import_hf

    work = tmp_path_factory.mktemp("gguf_blocks")
    ck = import_hf(write_gguf(work / "tiny.gguf"), work / "ck")
    return export_onnx(ck, work / "onnx")


def _logits(onnx_dir, ids, cfg):
    """Every position's logits of the graph in onnx_dir, the prompt from an empty cache."""
    import onnxruntime as ort

    from tinyt.contract import DECODER_WITH_PAST
    from tinyt.runtime.feeds import prefill_feeds

    session = ort.InferenceSession(str(onnx_dir / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    return session.run(["logits"], prefill_feeds(cfg, DECODER_WITH_PAST, ids))[0]


def test_weight_only_artifact_computes_the_dequantized_model(exported, tmp_path):
    from tinyt.checkpoint import load_checkpoint
    from tinyt.export.compare import reorder_bound
    from tinyt.export.quantize import quantize

    out = quantize(exported, tmp_path / "q", bits=4, block_size=32, mode="weight-only",
                   gguf_blocks=True)
    recipe = quantize(exported, tmp_path / "r", bits=4, block_size=32, mode="weight-only")
    record = json.loads((out / "manifest.json").read_text())["quantization"]["gguf_blocks"]
    assert len(record["carried"]) == 9 and record["not_carried"] == {}
    assert sum("(Q8_0)" in c for c in record["carried"]) == 1  # the tied table, 8-bit
    cfg = load_checkpoint(json.loads((exported / "manifest.json").read_text())["source"]["path"]
                          ).config
    ids = np.array([[5, 70, 200, 3, 9, 261, 33, 140, 7, 99, 12, 250]], np.int64)
    want = _logits(exported, ids, cfg)
    got, other = _logits(out, ids, cfg), _logits(recipe, ids, cfg)
    assert got.shape == want.shape and got.dtype == want.dtype
    worst, bound = float(np.abs(got - want).max()), reorder_bound(cfg, float(np.abs(want).max()))
    assert worst <= bound, (worst, bound)
    assert float(np.abs(other - want).max()) > 10 * worst  # the recipe's 4 bits: ~1e-2


def test_refusals(exported, tmp_path):
    from tinyt.export.quantize import quantize

    with pytest.raises(QuantizeError, match="block_size 32"):
        quantize(exported, tmp_path / "a", bits=4, block_size=64, gguf_blocks=True)
    plain = tmp_path / "plain"  # the same artifact, its source checkpoint gone
    shutil.copytree(exported, plain)
    manifest = json.loads((plain / "manifest.json").read_text())
    manifest["source"]["path"] = str(tmp_path / "elsewhere")
    (plain / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(QuantizeError, match="not exported from a GGUF import"):
        quantize(plain, tmp_path / "b", bits=4, block_size=32, gguf_blocks=True)
