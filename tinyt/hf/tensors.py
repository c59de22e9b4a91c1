"""tinyt's tensors by role: the one table of names every family's weights are written against.

    role           tinyt tensor                      Llama layout (Hugging Face)
    token_embd     transformer.wte.weight            model.embed_tokens.weight
    attn_norm      transformer.h.{i}.ln_1            model.layers.{i}.input_layernorm
    attn_qkv       transformer.h.{i}.attn.c_attn     self_attn.q_proj | k_proj | v_proj (stacked)
    ffn_up         transformer.h.{i}.mlp.c_fc        mlp.gate_proj | up_proj (stacked)
    ...

A family file (tinyt/hf/families/) lists its tensors as `role=HF name(s)`; several names are
stacked by rows as tinyt fuses them (q, k, v; gate, up). `{i}` is a block's index, `{w}` both
`weight` and `bias` (a bias tinyt's model lacks is skipped, or written as zeros by a class that
always has one). llama.cpp's gguf-py `tensor_mapping.py` keeps one table the same way.
"""
from __future__ import annotations

from tinyt.hf.family import Weight
from tinyt.hf.weights import gate_up_rows, qkv_rows

BLOCK = "transformer.h.{i}."  # block i in tinyt
LAYER = "model.layers.{i}."  # block i in the Llama layouts (and ModernBERT's)
OURS = {
    "token_embd": "transformer.wte.weight",
    "pos_embd": "transformer.wpe.weight",
    "type_embd": "transformer.wtt.weight",  # BERT's token types (segments)
    "embd_norm": "transformer.ln_e.{w}",  # the embeddings' norm (BERT's)
    "attn_norm": BLOCK + "ln_1.{w}",  # before attention; BERT's after its sum
    "attn_qkv": BLOCK + "attn.c_attn.{w}",  # q, k, v fused [(nh + 2 nkv) * hs, C]
    "attn_q_norm": BLOCK + "attn.q_norm.weight",
    "attn_k_norm": BLOCK + "attn.k_norm.weight",
    "attn_out": BLOCK + "attn.c_proj.{w}",
    "attn_out_norm": BLOCK + "ln_1_out.{w}",  # of attention's output (Gemma's, OLMo-2's)
    "ffn_norm": BLOCK + "ln_2.{w}",
    "ffn_up": BLOCK + "mlp.c_fc.{w}",  # gated: the gate's rows, then the up projection's
    "ffn_down": BLOCK + "mlp.c_proj.{w}",
    "ffn_out_norm": BLOCK + "ln_2_out.{w}",  # of the MLP's output (Gemma's, OLMo-2's)
    "output_norm": "transformer.ln_f.{w}",
    "output": "lm_head.weight",
    "pooler": "pooler.{w}",  # a classifier's dense layer on the pooled token
    "pooler_norm": "pooler_norm.{w}",
    "classifier": "classifier.{w}",
}
STACKED = {"attn_qkv": qkv_rows, "ffn_up": gate_up_rows}  # how stacked HF tensors split back

# The Llama layout, which Qwen2 / Qwen3, Mistral, SmolLM3, Granite, Gemma, Phi-3 and OLMo-2
# take whole or in part (each family file says which rows it changes)
LLAMA_LAYOUT: dict[str, str | tuple[str, ...]] = {
    "token_embd": "model.embed_tokens.weight",
    "attn_norm": LAYER + "input_layernorm.{w}",
    "attn_qkv": (LAYER + "self_attn.q_proj.{w}", LAYER + "self_attn.k_proj.{w}",
                 LAYER + "self_attn.v_proj.{w}"),
    "attn_q_norm": LAYER + "self_attn.q_norm.weight",  # where the model has them (Qwen3)
    "attn_k_norm": LAYER + "self_attn.k_norm.weight",
    "attn_out": LAYER + "self_attn.o_proj.{w}",
    "ffn_norm": LAYER + "post_attention_layernorm.{w}",
    "ffn_up": (LAYER + "mlp.gate_proj.{w}", LAYER + "mlp.up_proj.{w}"),
    "ffn_down": LAYER + "mlp.down_proj.{w}",
    "output_norm": "model.norm.{w}",
    "output": "lm_head.weight",
}


def weights(theirs: dict[str, str | tuple[str, ...]],
            conv1d: tuple[str, ...] = ()) -> tuple[Weight, ...]:
    """A family's tensors from `role -> HF name(s)`; `conv1d` the roles stored [in, out]."""
    unknown = sorted(set(theirs) - set(OURS))
    if unknown:
        raise ValueError(f"tensor roles {unknown} are not tinyt's: {', '.join(OURS)}")
    out = []
    for role, names in theirs.items():
        names = (names,) if isinstance(names, str) else tuple(names)
        out.append(Weight(OURS[role], names, rows=STACKED[role] if len(names) > 1 else None,
                          conv1d=role in conv1d))
    return tuple(out)
