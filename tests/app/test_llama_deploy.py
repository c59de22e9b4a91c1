"""The deployment chain on Llama-family models: export with the cache sized by n_kv_head,
verified against PyTorch; `optimize --target cpu` fusing RMSNorm, rotary positions and
attention (counted per layer); the shared-cache pair on GroupQueryAttention with kv_num_heads
and its own rotary; INT8 and INT4 with the accuracy report; the runtime generating on each."""

import numpy as np
import onnxruntime as ort
import pytest
import torch
from llama_reference import small_llama

from tinyt.checkpoint import load_checkpoint
from tinyt.contract import ONNX_FILE
from tinyt.manifest import check_manifest

# GroupQueryAttention's CPU rotary needs head_dim % 16 == 0: width 64 over 4 heads.
SHAPES = {
    "grouped": dict(n_embd=64, n_head=4, n_kv_head=2, n_inner=96),  # Llama, tied
    "qwen2": dict(n_embd=64, n_head=4, n_kv_head=4, n_inner=96, qkv_bias=True,
                  tie_weights=False),  # one kv head per head, q/k/v biases, untied
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def llama_ckpt(request, tmp_path_factory, corpus_dir):
    """A small Llama-form model trained a little on the corpus (greedy tokens with margins)."""
    from tinyt.config import TrainConfig
    from tinyt.train import train

    cfg = small_llama(block_size=64, vocab_size=300, **SHAPES[request.param])
    out = tmp_path_factory.mktemp(f"llama-{request.param}") / "ck"
    return train(cfg, TrainConfig(max_steps=40, batch_size=8, warmup_steps=2, eval_interval=40,
                                  eval_batches=2, learning_rate=3e-3, min_lr=3e-4),
                 out, data=str(corpus_dir), log=lambda s: None)


@pytest.fixture(scope="module")
def chain(llama_ckpt, tmp_path_factory):
    """export -> optimize (cpu) -> shared-cache; quantized 8 and 4 bits, and their pairs."""
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    root = tmp_path_factory.mktemp("llama-chain")
    out = {"onnx": export_onnx(llama_ckpt, root / "onnx")}
    out["opt"] = optimize(out["onnx"], root / "opt", target="cpu")
    out["gqa"] = optimize(out["opt"], root / "gqa", target="gqa")
    for bits in (8, 4):
        out[f"int{bits}"] = quantize(out["opt"], root / f"int{bits}", bits=bits, block_size=16)
    out["int8-gqa"] = optimize(out["int8"], root / "int8-gqa", target="gqa")
    return out


@pytest.mark.slow
def test_the_cache_is_sized_by_the_key_value_heads(llama_ckpt, chain):
    cfg = load_checkpoint(llama_ckpt).config
    s = ort.InferenceSession(str(chain["onnx"] / ONNX_FILE), providers=["CPUExecutionProvider"])
    shapes = {i.name: i.shape for i in [*s.get_inputs(), *s.get_outputs()]}
    assert shapes["past_key_values.0.key"] == ["batch_size", cfg.kv_heads,
                                               "past_sequence_length", cfg.head_dim]
    assert shapes["present.1.value"][1] == cfg.kv_heads
    g = ort.InferenceSession(str(chain["gqa"] / ONNX_FILE), providers=["CPUExecutionProvider"])
    assert {i.name: i.shape for i in g.get_inputs()}["past_key_values.0.key"] == \
        ["batch_size", cfg.kv_heads, "max_sequence_length", cfg.head_dim]


def test_export_and_optimized_graphs_verify_against_pytorch(llama_ckpt, chain):
    from tinyt.export import verify

    for name in ("onnx", "opt", "gqa"):
        report = verify(llama_ckpt, chain[name])
        assert report["passed"], (name, report)


def test_optimize_fuses_rmsnorm_rotary_and_attention_in_every_layer(llama_ckpt, chain):
    cfg = load_checkpoint(llama_ckpt).config
    ops = check_manifest(chain["opt"])["op_counts"]
    norms = ops.get("SimplifiedLayerNormalization", 0) + \
        ops.get("com.microsoft.SkipSimplifiedLayerNormalization", 0)
    assert norms == 2 * cfg.n_layer + 1  # ln_1, ln_2 per layer, ln_f
    assert ops.get("com.microsoft.RotaryEmbedding") == 2 * cfg.n_layer  # q and k
    assert ops.get("com.microsoft.MultiHeadAttention") == cfg.n_layer
    assert not {"ReduceMean", "Sqrt", "Reciprocal", "Neg"} & set(ops)  # fused away
    gqa = {n.op_type: n for n in __import__("onnx").load(
        str(chain["gqa"] / ONNX_FILE)).graph.node}["GroupQueryAttention"]
    attrs = {a.name: a.i for a in gqa.attribute}
    assert (attrs["num_heads"], attrs["kv_num_heads"], attrs["do_rotary"]) == \
        (cfg.n_head, cfg.kv_heads, 1)


def test_quantized_graphs_report_accuracy_and_keep_the_tie(llama_ckpt, chain):
    cfg = load_checkpoint(llama_ckpt).config
    for bits in (8, 4):
        m = check_manifest(chain[f"int{bits}"])
        acc = m["accuracy"]
        # A 40-step model's logits are flat, so its top-1 is fragile: INT8 moves it rarely,
        # INT4 (16 levels per block) more; KL stays far below a wrong model's (~1 nat).
        assert acc["top1_agreement"] >= (0.9 if bits == 8 else 0.7), (bits, acc)
        assert 0 <= acc["kl_divergence"] < (0.01 if bits == 8 else 0.1), (bits, acc)
        assert m["quantization"]["size_ratio"] < (0.5 if bits == 8 else 0.4)
        if cfg.tie_weights:
            assert m["quantization"]["shared_tables"], m["quantization"]


def test_the_runtime_generates_on_every_graph_as_pytorch_does(llama_ckpt, chain):
    from tinyt.model import generate
    from tinyt.runtime import load

    ck = load_checkpoint(llama_ckpt)
    prompt = "def main():\n    "
    ids = ck.tokenizer.encode_prompt(prompt)
    with torch.no_grad():
        want = generate(ck.model, torch.tensor([ids]), 24, temperature=0)[0, len(ids):].tolist()
    for name in ("onnx", "opt", "gqa"):  # fp32 graphs: PyTorch's tokens
        got = load(chain[name]).generate_ids([ids], max_new_tokens=24)[0].token_ids
        assert got == want[:len(got)] and len(got) >= 1, name
    fp32 = load(chain["opt"])
    for name in ("int8", "int8-gqa", "int4"):  # batched and streamed as the fp32 ones
        lm = load(chain[name])
        rows = lm.generate_ids([ids, ids[:3]], max_new_tokens=8, min_new_tokens=8)
        assert [len(r.token_ids) for r in rows] == [8, 8]
        streamed = "".join(lm.stream(prompt, max_new_tokens=8))
        assert streamed == lm.generate(prompt, max_new_tokens=8)
    single = fp32.generate_ids([ids[:3]], max_new_tokens=8, min_new_tokens=8)[0].token_ids
    batched = fp32.generate_ids([ids, ids[:3]], max_new_tokens=8, min_new_tokens=8)[1].token_ids
    assert single == batched  # left padding keeps rotary positions


def test_kv_cache_bytes_per_token_follow_the_key_value_heads():
    full = small_llama(n_embd=64, n_head=4, n_kv_head=4)
    assert small_llama(n_embd=64, n_head=4, n_kv_head=2).kv_cache_bytes_per_token() * 2 == \
        full.kv_cache_bytes_per_token()
    assert small_llama(n_embd=64, n_head=4, n_kv_head=1).kv_cache_bytes_per_token() * 4 == \
        full.kv_cache_bytes_per_token() == 2 * 2 * 64 * 4
    np.testing.assert_equal(full.kv_heads, 4)


def test_optimum_loads_the_llama_artifacts_as_llama(llama_ckpt, chain, monkeypatch):
    """config.json carries Hugging Face's Llama / Qwen2 keys: Optimum's ORTModelForCausalLM
    runs tinyt's fp32 and INT8 graphs (cache of n_kv_head heads) as that model, greedy."""
    pytest.importorskip("optimum.onnxruntime", reason="the optimum extra is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from optimum.onnxruntime import ORTModelForCausalLM

    from tinyt.model import generate
    from tinyt.runtime import load

    ck = load_checkpoint(llama_ckpt)
    ids = torch.tensor([ck.tokenizer.encode("def main():\n")])
    n = ck.config.block_size - ids.shape[1]
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
              do_sample=False, pad_token_id=ck.tokenizer.eos_id)
    fp32 = ORTModelForCausalLM.from_pretrained(chain["opt"], provider="CPUExecutionProvider")
    with torch.no_grad():
        want = generate(ck.model, ids, n, temperature=0)
    assert torch.equal(fp32.generate(ids, **kw), want)
    int8 = ORTModelForCausalLM.from_pretrained(chain["int8"], provider="CPUExecutionProvider")
    ours = load(chain["int8"]).generate_ids([ids[0].tolist()], max_new_tokens=n,
                                            min_new_tokens=n)[0].token_ids
    assert int8.generate(ids, **kw)[0, ids.shape[1]:].tolist() == ours  # the same graph
