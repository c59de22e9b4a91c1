"""The shared-cache graphs' rotary tables (export/gqa_graph.py): computed by nodes from the
frequencies alone, which ONNX Runtime folds into the tables at load, so a graph file no longer
carries 2 x context x rotary_dims / 2 floats; the folded tables are rope_cache's (tinyt.model's
float32 angles) within an ulp of cos / sin, for plain, scaled, windowed (a base of their own)
and LongRoPE (short, long, their attention factor) settings."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tinyt.config import ModelConfig
from tinyt.export.gqa_rotary import LONGROPE_POSITIONS, ROPE_CACHES, rope_cache
from tinyt.export.gqa_rotary import rope_caches as _rope_caches
from tinyt.rope import is_longrope

# cos / sin in float32 by ONNX Runtime against numpy: one ulp (1.2e-7 at |x| <= 1) apart at
# most, times LongRoPE's attention factor (~1.2) where it scales the table
TABLE_TOL = 2.5e-7
LONG = [1.0 + 0.05 * i for i in range(24)]
POSITIONS = np.array([[0, 4095, 4097]], np.int64)
CONFIGS = {
    "llama3-131k": dict(n_embd=256, n_head=4, block_size=131072, rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}),
    "gemma3-local": dict(n_embd=256, n_head=1, head_size=256, block_size=32768,
                         rope_theta=1000000.0, rope_local_theta=10000.0, sliding_window=512,
                         full_attention_layers=(1,), n_layer=2),
    "phi4-longrope": dict(n_embd=256, n_head=2, block_size=131072, rope_theta=10000.0,
                          rotary_dim=48,
                          rope_scaling={"rope_type": "longrope", "factor": 32.0,
                                        "short_factor": [1.0] * 24, "long_factor": LONG,
                                        "original_max_position_embeddings": 4096}),
}


def _cfg(name):
    return ModelConfig(pos_encoding="rotary", norm="rmsnorm", **CONFIGS[name])


def _folded(cfg) -> dict[str, np.ndarray]:
    """The graph's tables as ONNX Runtime computes them (each table an output)."""
    g = helper.make_graph([], "tables", [
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        *([helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, 3])]
          if is_longrope(cfg) else [])], [])
    caches = _rope_caches(g, cfg)
    names = sorted({n for pair in caches.values() for n in pair}) + \
        ([LONGROPE_POSITIONS] if is_longrope(cfg) else [])
    g.output.extend(helper.make_tensor_value_info(
        n, TensorProto.INT64 if n == LONGROPE_POSITIONS else TensorProto.FLOAT, None)
        for n in names)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    assert sum(np.prod(t.dims) for t in g.initializer) < 1000  # no table in the file
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    out = {}
    for total in (1, cfg.block_size):  # LongRoPE: short tables, then long ones
        feeds = {"total_sequence_length": np.array(total, np.int32),
                 **({"position_ids": POSITIONS} if is_longrope(cfg) else {})}
        out.update({f"{n}@{total}": v for n, v in zip(names, s.run(names, feeds))})
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_folded_tables_are_rope_cache(name):
    cfg = _cfg(name)
    got = _folded(cfg)
    want = {}
    if is_longrope(cfg):  # one table, the short above the long; the positions pick the half
        both = [np.concatenate(pair) for pair in zip(rope_cache(cfg), rope_cache(cfg, long=True))]
        for total in (1, cfg.block_size):
            for n, table in zip(ROPE_CACHES[False], both):
                want[f"{n}@{total}"] = table
            np.testing.assert_array_equal(  # past the original context: the long half
                got.pop(f"{LONGROPE_POSITIONS}@{total}"),
                POSITIONS + (cfg.block_size if total > 4096 else 0))
    else:
        for local in sorted({cfg.rope_local_theta is not None and cfg.windowed(i)
                             for i in range(cfg.n_layer)}):
            for total in (1, cfg.block_size):
                for n, table in zip(ROPE_CACHES[local], rope_cache(cfg, local)):
                    want[f"{n}@{total}"] = table
    assert set(got) == set(want)
    for k in want:
        rows = cfg.block_size * (2 if is_longrope(cfg) else 1)
        assert got[k].shape == want[k].shape == (rows, cfg.rotary_dims // 2), k
        assert np.abs(got[k] - want[k]).max() <= TABLE_TOL, k


def test_a_131k_context_graph_file_holds_no_table(tmp_path):
    """A Llama-3.2-style model at its 131,072-token context: the shared-cache graph file is
    its weights and the frequencies (it held 2 x 131,072 x 8 floats of tables, 8 MiB, before),
    and it generates what the contract graph does."""
    import torch
    from hf_fixtures import VOCAB, tokenizer

    import tinyt.runtime as rt
    from tinyt.checkpoint import save_checkpoint
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.model import build_model

    cfg = ModelConfig(vocab_size=VOCAB, n_layer=2, n_head=2, n_kv_head=1, n_embd=64,
                      n_inner=128, norm="rmsnorm", pos_encoding="rotary", activation="swiglu",
                      bias=False, **{k: v for k, v in CONFIGS["llama3-131k"].items()
                                     if k not in ("n_embd", "n_head")})
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ckpt = save_checkpoint(tmp_path / "ck", model, tokenizer())
    onnx_dir = export_onnx(ckpt, tmp_path / "onnx")
    gqa = optimize(optimize(onnx_dir, tmp_path / "opt"), tmp_path / "gqa", target="gqa")
    proto = onnx.load(str(gqa / "model.onnx"))
    rotary = [t for t in proto.graph.initializer if t.name.startswith("/rotary")]
    assert rotary and all(np.prod(t.dims) <= 64 for t in rotary), \
        [(t.name, t.dims) for t in rotary]
    weights = sum(p.numel() for p in model.parameters()) * 4
    assert (gqa / "model.onnx").stat().st_size < weights + (1 << 20)
    ids = tokenizer().encode("def parse(argv):")
    want = rt.load(onnx_dir, threads=1).generate_ids([ids], max_new_tokens=8)[0].token_ids
    got = rt.load(gqa, threads=1, tune=False).generate_ids([ids], max_new_tokens=8)[0].token_ids
    assert got == want
