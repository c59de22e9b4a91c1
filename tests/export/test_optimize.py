import json

import onnx
import pytest

from tinyt.export import export_onnx, verify
from tinyt.export.optimize import OptimizeError, op_counts, optimize
from tinyt.manifest import ManifestError, check_manifest


@pytest.fixture(scope="module")
def cpu_opt(lm_onnx, tmp_path_factory):
    return optimize(lm_onnx, tmp_path_factory.mktemp("opt") / "cpu", target="cpu")


def tied_copies(path, V, E):
    model = onnx.load(str(path / "model.onnx"))
    return sum(sorted(i.dims) == sorted([V, E]) for i in model.graph.initializer)


def test_cpu_target_fuses_attention_layernorm_gelu(cpu_opt, tiny_ckpt):
    manifest = check_manifest(cpu_opt)
    cfg = json.loads((cpu_opt / "config.json").read_text())["tinyt"]["model"]
    counts = op_counts(onnx.load(str(cpu_opt / "model.onnx")))
    assert counts["com.microsoft.MultiHeadAttention"] == cfg["n_layer"]
    assert counts["com.microsoft.SkipLayerNormalization"] >= cfg["n_layer"]
    assert counts["com.microsoft.BiasGelu"] == cfg["n_layer"]
    assert "Erf" not in counts and "Softmax" not in counts  # all folded into fused ops
    assert manifest["stage"] == "optimize" and manifest["source"]["manifest"]["stage"] == "export"
    assert manifest["fusions"]["skip_layer_normalization"] >= cfg["n_layer"]
    worst = manifest["equivalence"]["worst"].values()
    assert all(w["max_abs"] <= w["bound"] < 1e-3 for w in worst)
    assert tied_copies(cpu_opt, cfg["vocab_size"], cfg["n_embd"]) == 1


def test_cpu_target_moves_the_kv_cache_into_attention(cpu_opt, lm_onnx):
    """present.i.key/value come straight out of MultiHeadAttention, which reads the past
    itself: no Concat / Transpose / Reshape of the cache is left in the graph."""
    model = onnx.load(str(cpu_opt / "model.onnx"))
    n_layer = json.loads((cpu_opt / "config.json").read_text())["tinyt"]["model"]["n_layer"]
    made_by = {o: n for n in model.graph.node for o in n.output}
    presents = [o.name for o in model.graph.output if o.name.startswith("present.")]
    assert len(presents) == 2 * n_layer
    assert {made_by[p].op_type for p in presents} == {"MultiHeadAttention"}
    for node in model.graph.node:
        if node.op_type == "MultiHeadAttention":
            assert node.input[6].startswith("past_key_values.") and node.input[6].endswith(".key")
            assert node.input[7].startswith("past_key_values.")
            assert node.input[3], "the packed QKV bias moved into the attention op"
    counts = op_counts(model)
    before = op_counts(onnx.load(str(lm_onnx / "model.onnx")))
    assert counts["Transpose"] == 0 < before["Transpose"]
    assert counts["Concat"] == 0 < before["Concat"]
    assert check_manifest(cpu_opt)["fusions"]["attention_with_past"] == n_layer


def test_kv_rewrite_leaves_graphs_without_the_pattern_alone(cpu_opt):
    from tinyt.export.kvfuse import attention_with_past
    model = onnx.load(str(cpu_opt / "model.onnx"))  # already rewritten: nothing to match
    before = model.SerializeToString()
    assert attention_with_past(model) == 0
    assert model.SerializeToString() == before


def test_optimized_graph_still_equals_pytorch(cpu_opt, tiny_ckpt):
    report = verify(tiny_ckpt, cpu_opt)
    assert report["passed"], report["failures"]


def test_portable_target_keeps_standard_ops(lm_onnx, tiny_ckpt, tmp_path):
    out = optimize(lm_onnx, tmp_path / "portable", target="portable", level="basic")
    counts = op_counts(onnx.load(str(out / "model.onnx")))
    assert not [k for k in counts if "." in k]  # no com.microsoft (or any other) domain
    cfg = json.loads((out / "config.json").read_text())["tinyt"]["model"]
    assert tied_copies(out, cfg["vocab_size"], cfg["n_embd"]) == 1  # folding did not copy it
    assert verify(tiny_ckpt, out)["passed"]


def test_classifier_optimizes(tiny_clf, tmp_path):
    """An encoder's residual norms end as Sum + LayerNormalization (export/encoder_fusions.py),
    a decoder's stay fused (above)."""
    onnx_dir = export_onnx(tiny_clf, tmp_path / "clf-onnx")
    out = optimize(onnx_dir, tmp_path / "clf-opt")
    counts = op_counts(onnx.load(str(out / "model.onnx")))
    assert "com.microsoft.SkipLayerNormalization" not in counts
    assert counts["Sum"] == out.manifest["fusions"]["skip_layer_norm_as_sum"] >= 1
    assert verify(tiny_clf, out)["passed"]


@pytest.mark.parametrize("kw,needle", [
    (dict(target="tpu"), "target='tpu' is not one of cpu, portable, gqa"),
    (dict(level="max"), "level='max' is not one of basic, extended, all"),
    (dict(target="portable", level="extended"), "use level='basic'"),
    (dict(target="cuda"), "target='cuda' is not one of cpu, portable, gqa"),
])
def test_bad_requests(lm_onnx, tmp_path, kw, needle):
    with pytest.raises(OptimizeError, match=needle):
        optimize(lm_onnx, tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists()


def test_refuses_to_optimize_twice_or_a_non_artifact(cpu_opt, tiny_ckpt, tmp_path):
    with pytest.raises(OptimizeError, match="was made by stage 'optimize'"):
        optimize(cpu_opt, tmp_path / "again")
    with pytest.raises(ManifestError, match="has no manifest.json"):
        optimize(tiny_ckpt, tmp_path / "x")


def test_fails_when_attention_does_not_fuse(lm_onnx, tmp_path, monkeypatch):
    import tinyt.export.optimize as O
    monkeypatch.setattr(O, "optimize_for_ort", lambda model: (model, {}))
    with pytest.raises(OptimizeError, match="attention fused in 0 of 2 layers"):
        optimize(lm_onnx, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_refold_keeps_one_copy():
    import numpy as np
    from onnx import helper, numpy_helper

    from tinyt.export.optimize import refold_transposed_copies
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wT"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w.T.copy(), "wT"),
         numpy_helper.from_array(w + 1, "other")])
    model = helper.make_model(graph)
    assert refold_transposed_copies(model) == 1
    assert sorted(i.name for i in model.graph.initializer) == ["other", "w"]
    import onnxruntime as ort
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((1, 3), dtype=np.float32)
    assert np.array_equal(sess.run(None, {"x": x})[0], x @ w.T)


def test_stages_return_what_they_did(cpu_opt, corpus_dir, tmp_path):
    """The path a stage returns carries the manifest it wrote: callers (the CLI) print from it
    without reading the file back."""
    from tinyt.export.package import package
    from tinyt.export.quantize import quantize
    q = quantize(cpu_opt, tmp_path / "q", data=str(corpus_dir))
    p = package(q, tmp_path / "p", format="onnx")
    g = optimize(q, tmp_path / "g", target="gqa")
    for path in (cpu_opt, q, p, g):
        assert path.manifest == check_manifest(path)
    assert q.manifest["stage"] == "quantize" and g.manifest["stage"] == "shared-cache"


def test_no_graph_of_the_fusion_outlives_it(lm_onnx, tmp_path):
    """onnxscript's rewrite rules (module globals) kept their last match, and through it the
    whole IR graph and the source proto it wraps: a second copy of every weight for the rest
    of the process (4.8 GB at the Llama-3.2-1B shape). None may be left after optimize (in a
    process of its own, so that no other test's graphs count)."""
    import subprocess
    import sys

    code = ("import gc, sys, onnx_ir as ir\n"
            "from tinyt.export.optimize import optimize\n"
            "optimize(sys.argv[1], sys.argv[2], target='cpu')\n"
            "gc.collect()\n"
            "print(sum(isinstance(o, ir.Node) for o in gc.get_objects()))\n")
    out = subprocess.run([sys.executable, "-c", code, str(lm_onnx), str(tmp_path / "opt")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "0"


@pytest.mark.slow
def test_refold_keeps_a_tensor_over_2_gib():
    """Phi-4-mini's tied fp32 table is 2.46 GB: a TensorProto over protobuf's 2 GiB cannot be
    copied (serialized), so refolding removes the transposed copies in place, the big table
    kept as it is (optimize died with a DecodeError at that shape)."""
    import numpy as np
    from onnx import helper, numpy_helper

    from tinyt.export.optimize import refold_transposed_copies
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = helper.make_model(helper.make_graph([], "g", [], [],
                                                [numpy_helper.from_array(w, "w")]))
    big = model.graph.initializer.add()  # made in place: a copy of it would fail already
    big.name, big.data_type = "table", onnx.TensorProto.FLOAT
    big.dims.extend([2 ** 20 + 1, 512])
    big.raw_data = bytes(4 * 512 * (2 ** 20 + 1))  # 2.15 GB
    model.graph.initializer.add().CopyFrom(numpy_helper.from_array(w.T.copy(), "wT"))
    assert refold_transposed_copies(model) == 1
    assert [i.name for i in model.graph.initializer] == ["w", "table"]
    assert len(model.graph.initializer[1].raw_data) == 4 * 512 * (2 ** 20 + 1)


def test_the_fp32_bound_follows_the_arithmetic():
    """compare.reorder_bound: relative to the output's size (never below MAGNITUDE_FLOOR),
    linear in depth, sqrt in the widest reduction; at real SmolLM2-135M's shape (30 layers,
    MLP 1,536, logits up to 35.8) it is 0.041 where its optimized graph measured 3.3e-3, and
    a wrong rewrite (a logit moved by a tenth of its size) is far beyond it."""
    from tinyt.config import ModelConfig
    from tinyt.export.compare import MAGNITUDE_FLOOR, reorder_bound

    smol = ModelConfig(block_size=8192, vocab_size=49152, n_layer=30, n_head=9, n_kv_head=3,
                       n_embd=576, n_inner=1536, norm="rmsnorm", pos_encoding="rotary",
                       bias=False, activation="swiglu", rope_theta=1e5)
    b = reorder_bound(smol, 35.8)
    assert 0.03 < b < 0.05 and 3.3e-3 < b / 10 and b < 35.8 / 10
    assert reorder_bound(smol, 71.6) == 2 * b  # relative to the size
    assert reorder_bound(smol, 1e-3) == reorder_bound(smol, MAGNITUDE_FLOOR)
    half = ModelConfig.from_dict({**smol.to_dict(), "n_layer": 15})
    assert abs(reorder_bound(half, 35.8) / b - 16 / 31) < 1e-12  # depth: layers + head
