"""4-bit weights calibrated on activations (export/awq.py, export/mixed.py) on a small
Llama-form decoder: the recipe's refusals, the activation-aware scales folded into the fp32
graph without moving its outputs, and mixed precision keeping its chosen tables at 8 bits
within the byte budget."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tinyt.errors import QuantizeError
from tinyt.recipe import QuantRecipe


@pytest.fixture(scope="module")
def llama_opt(tmp_path_factory, tiny_ckpt):
    """A Llama-form decoder (RMSNorm, SwiGLU, 2 of 4 heads for keys / values) on random
    weights with the tiny checkpoint's tokenizer, exported and optimized for the CPU (fused
    norms, gate and up in one matmul)."""
    import torch

    from tinyt.checkpoint import load_checkpoint, save_checkpoint
    from tinyt.config import ModelConfig
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.model import build_model

    cfg = ModelConfig(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_kv_head=2,
                      n_embd=64, n_inner=96, norm="rmsnorm", pos_encoding="rotary",
                      activation="swiglu", bias=False)
    root = tmp_path_factory.mktemp("llama-int4")
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():  # norms of their own (equal tables would be stored once)
        for name, p in model.named_parameters():
            if "ln_" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    ck = save_checkpoint(root / "ck", model, load_checkpoint(tiny_ckpt).tokenizer)
    return optimize(export_onnx(ck, root / "onnx"), root / "opt", target="cpu")


@pytest.mark.parametrize("kw, needle", [
    (dict(bits=8, awq=True), "awq=True calibrates 4-bit MatMulNBits blocks"),
    (dict(bits=4, kernel="qgemm", awq=True), "kernel"),
    (dict(mode="static", max_bytes=10**6), "max_bytes=1000000 calibrates 4-bit"),
    (dict(bits=4, max_bytes=0), "max_bytes=0 must be a positive number of bytes"),
    (dict(bits=4, max_bytes=1.5e6), "must be a positive number of bytes"),
    (dict(bits=4, awq="yes"), "awq='yes' must be True or False"),
])
def test_the_recipe_refuses_calibration_where_no_4bit_blocks_are(kw, needle):
    with pytest.raises(QuantizeError, match=needle):
        QuantRecipe.request(**kw)


def test_the_recipe_records_and_reads_back_its_calibration():
    r = QuantRecipe.request(bits=4, awq=True, max_bytes=112 * 10**6)
    assert r.calibrated and r.options()["awq"] is True and r.options()["max_bytes"] == 112e6
    assert QuantRecipe.from_json(json.loads(json.dumps(r.to_json()))) == r
    assert QuantRecipe.from_manifest(r.options()) == r
    plain = QuantRecipe.request(bits=4)
    assert not plain.calibrated and "awq" not in plain.options()
    assert QuantRecipe.from_manifest({"mode": "dynamic", "bits": 4}).awq is False  # older


def _logits(proto: onnx.ModelProto, feeds: dict) -> np.ndarray:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], feeds)[0]


def test_awq_scales_keep_the_fp32_outputs(llama_opt):
    """x @ W = (x / s) @ (s · W): with any positive s folded where the graph allows (the norms'
    weights before qkv and gate / up, gate / up's up columns before down, a Mul before
    attention's output projection) the fp32 logits are the source's to fp32 rounding, held to
    compare.reorder_bound (the same arithmetic in another order); the scales are far from 1
    (e^N(0, 1)), so a fold on the wrong side would move logits by their own size."""
    from tinyt.contract import DECODER_WITH_PAST
    from tinyt.export.awq import fold, scalable_matmuls
    from tinyt.export.compare import reorder_bound
    from tinyt.manifest import read_model_config
    from tinyt.runtime.feeds import prefill_feeds

    proto = onnx.load(str(llama_opt / "model.onnx"))
    cfg = read_model_config(llama_opt)[0]
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 16))
    feeds = prefill_feeds(cfg, DECODER_WITH_PAST, ids)
    want = _logits(proto, feeds)
    groups = scalable_matmuls(proto)
    rng = np.random.default_rng(1)
    plan = {x: np.exp(rng.standard_normal(onnx.numpy_helper.to_array(
        [i for i in proto.graph.initializer if i.name == nodes[0].input[1]][0]).shape[0])
    ).astype(np.float32) for x, nodes in groups.items()}
    where = fold(proto, plan)
    got = _logits(proto, feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    bound = reorder_bound(cfg, float(np.abs(want).max()))
    assert float(np.abs(got - want).max()) <= bound, (float(np.abs(got - want).max()), bound)
    kinds = {"norm": sum("norm's weight" in w for w in where.values()),
             "columns": sum(" columns " in w for w in where.values()),
             "mul": sum("activation side" in w for w in where.values())}
    # per layer: ln_1 -> c_attn, ln_2 -> c_fc (norm weights), up columns -> mlp.c_proj,
    # a Mul -> attn.c_proj
    assert kinds == {"norm": 2 * cfg.n_layer, "columns": cfg.n_layer, "mul": cfg.n_layer}, where


def test_awq_and_mixed_precision_keep_the_chosen_tables_at_8_bits_within_budget(
        llama_opt, corpus_dir, tmp_path):
    """max_bytes two layer tables above the all-4-bit size: the tables mixed precision picks
    (most KL per added byte) are MatMulNBits at 8 bits in the graph, the rest at 4, the file
    within the budget; the manifest records the recipe, the scales' α and where they went."""
    from tinyt.export.mixed import table_bytes
    from tinyt.export.quantize import quantize
    from tinyt.manifest import check_manifest

    q4 = quantize(llama_opt, tmp_path / "q4", bits=4, block_size=16, data=str(corpus_dir))
    base = check_manifest(q4)["quantization"]["bytes"]
    # two of the largest tables' worth (c_fc: 192 outputs of 64) from 4 bits to 8
    room = 2 * (table_bytes(192, 64, 8, 16, "symmetric") - table_bytes(192, 64, 4, 16,
                                                                        "asymmetric"))
    out = quantize(llama_opt, tmp_path / "mixed", bits=4, block_size=16, awq=True,
                   max_bytes=base + room, data=str(corpus_dir))
    m = check_manifest(out)
    q = m["quantization"]
    assert m["options"]["awq"] is True and m["options"]["max_bytes"] == base + room
    assert q["recipe"]["awq"] is True and q["recipe"]["keep_8bit"] == []  # the request
    mixed = q["calibrated_4bit"]["mixed"]
    chosen = mixed["kept_8bit"]
    assert chosen and q["bytes"] <= base + room and mixed["estimated_bytes"] <= base + room
    assert len(q["kept_8bit"]) >= len(chosen), q["kept_8bit"]  # "module (op)", a tied table's
    # two readers each
    graph = onnx.load(str(out / "model.onnx")).graph
    bits = {n.name: next(a.i for a in n.attribute if a.name == "bits") for n in graph.node
            if n.op_type == "MatMulNBits"}
    for name, b in bits.items():
        module = ".".join(name.strip("/").split("/")[:-1]) if name.startswith("/") else "lm_head"
        assert b == (8 if module in chosen else 4), (name, b, chosen)
    awq = q["calibrated_4bit"]["awq"]
    assert set(awq) >= {f"transformer.h.{i}.{m}" for i in range(2)
                        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    assert all(r["output_error_vs_plain"] <= 1.0 for r in awq.values())  # α = 0 is tried


def test_the_cli_takes_awq_and_a_budget_and_names_what_they_need(lm_onnx, tmp_path):
    from conftest import run_tinyt

    done = run_tinyt("quantize", lm_onnx, tmp_path / "q", "--awq", "--max-mb", "1")
    assert done.returncode != 0 and "awq=True calibrates 4-bit MatMulNBits blocks (bits=4" \
        in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "q").exists()
