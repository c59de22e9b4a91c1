"""The optimize stage's encoder rewrites (export/encoder_fusions.py): SkipLayerNormalization
written back as Sum + LayerNormalization, which no loader fuses again; the embedding sum +
LayerNorm into ONNX Runtime's EmbedLayerNormalization (fuse_embedding=True) for BERT,
DistilBERT, RoBERTa and XLM-R at their real settings (512 positions, offsets, token types),
exact with left padding; and what it refuses, by name."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hf_fixtures import save_encoder
from onnx import TensorProto, helper, numpy_helper

from tinyt.config import ModelConfig
from tinyt.export.compare import reorder_bound
from tinyt.export.encoder_fusions import unfuse_skip_layer_norms
from tinyt.export.optimize import OptimizeError, op_counts, optimize

# (token-type table rows, position offset) as the families import
FAMILIES = {"bert": (2, 0), "distilbert": (0, 0), "roberta": (1, 2), "xlm-roberta": (1, 2)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def exported(request, tmp_path_factory):
    """(family, its one-layer export) at the real model's settings."""
    from tinyt.export import export_onnx
    from tinyt.hf import import_hf
    root = tmp_path_factory.mktemp(request.param)
    save_encoder(request.param, root / "hf", sentence=False, num_hidden_layers=1)
    import_hf(root / "hf", root / "ckpt")
    return request.param, export_onnx(root / "ckpt", root / "onnx")


def _model_cfg(path):
    return json.loads((path / "config.json").read_text())["tinyt"]["model"]


def _feeds(session, cfg, T: int):
    """Row 0 left-padded by 5, row 1 the same tokens right-padded, row 2 all T tokens."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, cfg["vocab_size"], (3, T))
    ids[0, 5:] = ids[1, :T - 5]
    mask = np.ones((3, T), np.int64)
    mask[0, :5] = mask[1, T - 5:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in [i.name for i in session.get_inputs()]:
        types = rng.integers(0, 2, (3, T))
        types[0, 5:] = types[1, :T - 5]
        feeds["token_type_ids"] = types
    return feeds


def test_embedding_fuses_into_one_op_and_keeps_tinyt_positions(exported, tmp_path):
    kind, onnx_dir = exported
    types, offset = FAMILIES[kind]
    out = optimize(onnx_dir, tmp_path / "opt", fuse_embedding=True)
    cfg = _model_cfg(out)
    model = onnx.load(str(out / "model.onnx"))
    graph, counts = model.graph, op_counts(model)
    assert counts["com.microsoft.EmbedLayerNormalization"] == 1
    assert "Gather" not in counts  # every table lookup is inside the op now
    assert counts["LayerNormalization"] == 2 * cfg["n_layer"]  # the blocks' own
    assert out.manifest["fusions"]["embed_layer_norm"] == 1
    assert out.manifest["options"]["fuse_embedding"] is True
    (node,) = [n for n in graph.node if n.op_type == "EmbedLayerNormalization"]
    dims = {i.name: list(i.dims) for i in graph.initializer}
    assert dims[node.input[2]] == [cfg["vocab_size"], cfg["n_embd"]]
    assert dims[node.input[3]] == [cfg["block_size"] + offset, cfg["n_embd"]]
    assert (dims[node.input[4]] if node.input[4] else None) == \
        ([types, cfg["n_embd"]] if types else None)
    assert bool(node.input[1]) == bool(types) and node.input[8]  # explicit position_ids
    # against the export: 512 tokens reach the table's last row (+ RoBERTa's offset); the
    # left-padded row must equal its right-padded twin, as positions count from the mask
    # (the op's own positions, 0..S-1 by index, would shift row 0 by 5)
    ref = ort.InferenceSession(str(onnx_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = _feeds(ref, cfg, cfg["block_size"])
    want, have = ref.run(["last_hidden_state"], feeds)[0], got.run(["last_hidden_state"],
                                                                     feeds)[0]
    real = feeds["attention_mask"].astype(bool)
    assert have.shape == want.shape and have.dtype == want.dtype
    bound = reorder_bound(ModelConfig.from_dict(cfg), float(np.abs(want[real]).max()))
    assert np.abs(have - want)[real].max() <= bound
    assert np.abs(have[0, real[0]] - have[1, real[1]]).max() <= bound


def test_residual_norms_stay_unfused_wherever_the_graph_loads(exported, tmp_path):
    """Default optimize: each SkipLayerNormalization is Sum + LayerNormalization again, and
    ONNX Runtime at its default level (Optimum's, fastembed's sessions) does not fuse them
    back, where it would an Add."""
    kind, onnx_dir = exported
    out = optimize(onnx_dir, tmp_path / "opt")
    n_layer = _model_cfg(out)["n_layer"]
    counts = op_counts(onnx.load(str(out / "model.onnx")))
    assert "com.microsoft.SkipLayerNormalization" not in counts
    assert counts["Sum"] == counts["LayerNormalization"] == 2 * n_layer + 1  # + embeddings
    assert out.manifest["fusions"]["skip_layer_norm_as_sum"] == 2 * n_layer + 1
    assert "fuse_embedding" not in out.manifest["options"]
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "as-loaded.onnx")
    ort.InferenceSession(str(out / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    loaded = op_counts(onnx.load(str(tmp_path / "as-loaded.onnx")))
    assert "SkipLayerNormalization" not in loaded and loaded["LayerNormalization"] == \
        2 * n_layer + 1


def _skip_norm_graph(outputs: list[str]) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    C = 16
    inits = [numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), n)
             for n in ("gamma", "beta", "bias")]
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"],
                            outputs, domain="com.microsoft", epsilon=1e-5, name="sln")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "S", C])
                      for n in ("x", "skip")],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def test_unfused_norm_gives_the_fused_ops_outputs():
    """out = LayerNorm(x + bias + skip), and the sum itself (output 3, the pre-norm residual
    stream). The sum's three terms are added in another order (one rounding of values ~3:
    4e-7), which the norm scales by gamma / std (~3 here): 1e-5 bounds it."""
    fused = _skip_norm_graph(["y", "", "", "total"])
    unfused = _skip_norm_graph(["y", "", "", "total"])
    assert unfuse_skip_layer_norms(unfused) == 1
    assert [n.op_type for n in unfused.graph.node] == ["Add", "Sum", "LayerNormalization"]
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((2, 3, 16)).astype(np.float32) for n in ("x", "skip")}
    runs = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            .run(["y", "total"], feeds) for m in (fused, unfused)]
    for a, b in zip(*runs):
        assert a.shape == b.shape and np.abs(a - b).max() <= 1e-5


def test_a_norm_whose_statistics_are_read_is_left_fused():
    model = _skip_norm_graph(["y", "mean", "", ""])
    before = model.SerializeToString()
    assert unfuse_skip_layer_norms(model) == 0
    assert model.SerializeToString() == before


@pytest.mark.parametrize("target", ["portable", "gqa"])
def test_embedding_fusion_is_for_target_cpu(exported, tmp_path, target):
    with pytest.raises(OptimizeError, match=f"for target 'cpu', not '{target}'"):
        optimize(exported[1], tmp_path / "out", target=target, fuse_embedding=True)
    assert not (tmp_path / "out").exists()


def test_embedding_fusion_is_refused_where_there_is_no_such_embedding(lm_onnx, tiny_clf,
                                                                       tmp_path):
    from tinyt.export import export_onnx
    with pytest.raises(OptimizeError, match="it is for encoders; this is a 'decoder_with_past'"):
        optimize(lm_onnx, tmp_path / "lm", fuse_embedding=True)
    clf = export_onnx(tiny_clf, tmp_path / "clf-onnx")  # tinyt's own: no embedding LayerNorm
    with pytest.raises(OptimizeError, match="embedding_norm=False"):
        optimize(clf, tmp_path / "clf", fuse_embedding=True)
    assert not (tmp_path / "lm").exists() and not (tmp_path / "clf").exists()


def test_modernbert_has_no_position_table_to_fuse(tmp_path):
    """Rotary positions: the embedding is the word rows and a LayerNorm, no table of positions
    for the op's required position_embedding."""
    from tinyt.export import export_onnx
    from tinyt.hf import import_hf
    save_encoder("modernbert", tmp_path / "mb", sentence=False, num_hidden_layers=1)
    import_hf(tmp_path / "mb", tmp_path / "mb-ckpt")
    mb = export_onnx(tmp_path / "mb-ckpt", tmp_path / "mb-onnx")
    with pytest.raises(OptimizeError, match="pos_encoding='rotary'.*ModernBERT"):
        optimize(mb, tmp_path / "mb-opt", fuse_embedding=True)
    assert not (tmp_path / "mb-opt").exists()
    out = optimize(mb, tmp_path / "mb-opt")  # its residual norms (pre-norm) as Sum + LayerNorm
    counts = op_counts(onnx.load(str(out / "model.onnx")))
    assert "com.microsoft.SkipLayerNormalization" not in counts and counts["Sum"] >= 1


def test_fails_when_the_embedding_does_not_fuse(exported, tmp_path, monkeypatch):
    import tinyt.export.optimize as O
    monkeypatch.setattr(O, "embed_layer_norm", lambda proto, cfg: 0)
    with pytest.raises(OptimizeError, match="embedding sum \\+ LayerNorm fused into "
                       "com.microsoft.EmbedLayerNormalization 0 times where 1 were expected"):
        optimize(exported[1], tmp_path / "out", fuse_embedding=True)
    assert not (tmp_path / "out").exists()


def test_quantize_refuses_the_fused_embedding_by_name(exported, tmp_path):
    """Quantization reads Gathers and MatMuls: the fused op's tables would stay fp32."""
    from tinyt.export.quantize import QuantizeError, quantize

    kind, onnx_dir = exported
    out = optimize(onnx_dir, tmp_path / "opt", fuse_embedding=True)
    with pytest.raises(QuantizeError, match="EmbedLayerNormalization.*without --fuse-embedding"):
        quantize(out, tmp_path / "int8")


@pytest.mark.slow
def test_the_cli_flag_fuses(exported, tmp_path, monkeypatch, capsys):
    from cli_run import run_cli

    kind, onnx_dir = exported
    code, out, err = run_cli(monkeypatch, capsys, "optimize", onnx_dir, tmp_path / "opt",
                             "--fuse-embedding")
    assert code == 0, err
    assert op_counts(onnx.load(str(tmp_path / "opt" / "model.onnx")))[
        "com.microsoft.EmbedLayerNormalization"] == 1
