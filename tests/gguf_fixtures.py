"""A tiny Llama written as llama.cpp's converter writes a GGUF (gguf.GGUFWriter): random
weights under llama.cpp's names, q / k rows permuted as convert_hf_to_gguf.py permutes them,
matrices in Q4_0 / Q4_1 / Q8_0 blocks (gguf.quants.quantize), norms F32, and a byte-level BPE
tokenizer (the 256 bytes, a few merges, three special tokens) in tokenizer.ggml.*.

    write_gguf(path, **overrides) -> path   (overrides: arch, types, pre, tie, ...)
    hf_state(path) -> the Hugging Face Llama's fp32 tensors the file holds (dequantized,
                      unpermuted: what an import must give)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tinyt.tokenizer import bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n" \
           "{% endfor %}"
# width 64, 2 layers, 4 / 2 heads of 16, MLP 96 (K = 64 or 96: blocks of 32 fit)
SIZE = dict(layers=2, width=64, heads=4, kv_heads=2, mlp=96, context=256)
# each matrix's block type: every type carried (Q4_0 attention, Q4_1 MLP, Q8_0 embedding)
TYPES = {"token_embd": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q4_0", "attn_v": "Q4_0",
         "attn_output": "Q4_0", "ffn_gate": "Q4_1", "ffn_up": "Q4_1", "ffn_down": "Q4_1",
         "output": "Q8_0"}


def tokens() -> tuple[list[str], list[int]]:
    """(tokens in id order, their llama.cpp types: 3 special, 1 normal)."""
    table = bytes_to_unicode()
    pieces = SPECIALS + [table[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
    return pieces, [3] * len(SPECIALS) + [1] * (len(pieces) - len(SPECIALS))


def permute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's two rotary halves interleaved."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]) \
        .swapaxes(1, 2).reshape(rows.shape)


def _weights(seed: int, tie: bool) -> dict[str, np.ndarray]:
    """Random weights under llama.cpp's names, HF's row order (before the permutation)."""
    rng = np.random.default_rng(seed)
    C, hs, M = SIZE["width"], SIZE["width"] // SIZE["heads"], SIZE["mlp"]
    V = len(tokens()[0])

    def w(*shape, scale=0.08):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    out = {"token_embd.weight": w(V, C, scale=0.5), "output_norm.weight": 1 + w(C, scale=0.1)}
    if not tie:
        out["output.weight"] = w(V, C)
    for i in range(SIZE["layers"]):
        out.update({f"blk.{i}.attn_norm.weight": 1 + w(C, scale=0.1),
                    f"blk.{i}.ffn_norm.weight": 1 + w(C, scale=0.1),
                    f"blk.{i}.attn_q.weight": w(SIZE["heads"] * hs, C),
                    f"blk.{i}.attn_k.weight": w(SIZE["kv_heads"] * hs, C),
                    f"blk.{i}.attn_v.weight": w(SIZE["kv_heads"] * hs, C),
                    f"blk.{i}.attn_output.weight": w(C, C),
                    f"blk.{i}.ffn_gate.weight": w(M, C), f"blk.{i}.ffn_up.weight": w(M, C),
                    f"blk.{i}.ffn_down.weight": w(C, M)})
    return out


def write_gguf(path: str | Path, *, arch: str = "llama", types: dict[str, str] | None = None,
               pre: str = "smollm", tie: bool = True, seed: int = 0,
               extra_tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A tiny Llama GGUF at path (SIZE, TYPES unless `types` overrides some); returns path."""
    import gguf

    types = {**TYPES, **(types or {})}
    pieces, kinds = tokens()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(SIZE["layers"])
    writer.add_context_length(SIZE["context"])
    writer.add_embedding_length(SIZE["width"])
    writer.add_feed_forward_length(SIZE["mlp"])
    writer.add_head_count(SIZE["heads"])
    writer.add_head_count_kv(SIZE["kv_heads"])
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(pieces))
    writer.add_rope_dimension_count(SIZE["width"] // SIZE["heads"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(pieces)
    writer.add_token_types(kinds)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    for name, value in {**_weights(seed, tie), **(extra_tensors or {})}.items():
        role = name.split(".")[-2]
        if role in ("attn_q", "attn_k"):
            value = permute(value, SIZE["heads"] if role == "attn_q" else SIZE["kv_heads"])
        kind = types.get(role, "F32") if value.ndim == 2 else "F32"
        qtype = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def hf_state(path: str | Path) -> dict[str, np.ndarray]:
    """What the file holds as a Hugging Face Llama's fp32 tensors, worked out independently of
    tinyt.hf.gguf: dequantized by gguf, q / k rows put back by inverting `permute`."""
    import gguf

    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
             "output": "lm_head", "attn_norm": "input_layernorm",
             "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        value = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        parts = t.name.split(".")
        role = parts[-2]
        if role in ("attn_q", "attn_k"):
            n = SIZE["heads"] if role == "attn_q" else SIZE["kv_heads"]
            inverse = np.argsort(permute(np.arange(value.shape[0]), n))
            value = value[inverse]
        prefix = f"model.layers.{parts[1]}." if parts[0] == "blk" else ""
        out[f"{prefix}{names[role]}.weight"] = value
    return out
