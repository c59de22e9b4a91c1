"""tinyt's tensors by role: the one table of names every family's weights are written against.

    role           tinyt tensor                      Llama layout (Hugging Face)
    token_embd     transformer.wte.weight            model.embed_tokens.weight
    attn_norm      transformer.h.{i}.ln_1            model.layers.{i}.input_layernorm
    attn_qkv       transformer.h.{i}.attn.c_attn     self_attn.q_proj | k_proj | v_proj (stacked)
    ffn_up         transformer.h.{i}.mlp.c_fc        mlp.gate_proj | up_proj (stacked)
    ...

An encoder-decoder's two stacks take the same roles under `enc.` and `dec.` (llama.cpp's
enc.blk / dec.blk), and the decoder's block adds its cross-attention:

    role           tinyt tensor                      BART layout (Hugging Face)
    enc.attn_qkv   encoder.h.{i}.attn.c_attn         model.encoder.layers.{i}.self_attn.q|k|v_proj
    dec.cross_q    decoder.h.{i}.cross.c_q           model.decoder.layers.{i}.encoder_attn.q_proj
    dec.cross_kv   decoder.h.{i}.cross.c_kv          encoder_attn.k_proj | v_proj (stacked)
    dec.cross_norm decoder.h.{i}.ln_x                encoder_attn_layer_norm
    enc.conv1      encoder.stem.conv1                (Whisper) model.encoder.conv1
    enc.attn_rel_b encoder.rel.weight                (T5) encoder.block.0.layer.0.SelfAttention.
                                                     relative_attention_bias.weight

A family file (tinyt/hf/families/) lists its tensors as `role=HF name(s)`; several names are
stacked by rows as tinyt fuses them (q, k, v; gate, up; cross k, v). `{i}` is a block's index
(the decoder's blocks for a dec. role), `{w}` both `weight` and `bias` (a bias tinyt's model
lacks is skipped, or written as zeros by a class that always has one). llama.cpp's gguf-py
`tensor_mapping.py` keeps one table the same way.
"""
from __future__ import annotations

from tinyt.hf.family import Weight
from tinyt.hf.weights import gate_up_rows, kv_rows, qkv_rows

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
# an encoder-decoder's stacks: the roles a stack has, under enc. and dec.
STACK_ROLES = ("token_embd", "pos_embd", "embd_norm", "attn_norm", "attn_qkv", "attn_out",
               "ffn_norm", "ffn_up", "ffn_down", "output_norm")
for _stack, _ours in (("enc", "encoder."), ("dec", "decoder.")):
    OURS.update({f"{_stack}.{role}": OURS[role].replace("transformer.", _ours)
                 for role in STACK_ROLES})
    OURS[f"{_stack}.attn_rel_b"] = _ours + "rel.weight"  # T5's relative bias [buckets, nh]
OURS.update({
    "dec.cross_norm": "decoder.h.{i}.ln_x.{w}",  # before (pre-norm) or after the cross sum
    "dec.cross_q": "decoder.h.{i}.cross.c_q.{w}",
    "dec.cross_kv": "decoder.h.{i}.cross.c_kv.{w}",  # k, v fused [2 nkv * hs, C]
    "dec.cross_out": "decoder.h.{i}.cross.c_proj.{w}",
    "logits_bias": "final_logits_bias",  # a buffer [1, vocab] (BART's, Marian's)
    "enc.conv1": "encoder.stem.conv1.{w}",  # an audio encoder's stem (Whisper's)
    "enc.conv2": "encoder.stem.conv2.{w}",
})
STACKED = {"attn_qkv": qkv_rows, "ffn_up": gate_up_rows,  # how stacked HF tensors split back
           "enc.attn_qkv": qkv_rows, "dec.attn_qkv": qkv_rows, "enc.ffn_up": gate_up_rows,
           "dec.ffn_up": gate_up_rows, "dec.cross_kv": kv_rows}

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


# BART's layout (fairseq's), which mBART, Marian and M2M100 / NLLB take whole or in part:
# each stack's embeddings, its layers' self-attention, MLP and their norms, the decoder's
# cross-attention, the stacks' final norms (pre-norm models'), and the logits' bias
def bart_layout(prefix: str = "model.") -> dict[str, str | tuple[str, ...]]:
    out: dict[str, str | tuple[str, ...]] = {}
    for stack, name in (("enc", "encoder"), ("dec", "decoder")):
        top, layer = f"{prefix}{name}.", f"{prefix}{name}.layers.{{i}}."
        out.update({
            f"{stack}.token_embd": top + "embed_tokens.weight",
            f"{stack}.pos_embd": top + "embed_positions.weight",  # BART's learned table
            f"{stack}.embd_norm": top + "layernorm_embedding.{w}",
            f"{stack}.attn_norm": layer + "self_attn_layer_norm.{w}",
            f"{stack}.attn_qkv": tuple(layer + f"self_attn.{p}_proj.{{w}}" for p in "qkv"),
            f"{stack}.attn_out": layer + "self_attn.out_proj.{w}",
            f"{stack}.ffn_norm": layer + "final_layer_norm.{w}",
            f"{stack}.ffn_up": layer + "fc1.{w}",
            f"{stack}.ffn_down": layer + "fc2.{w}",
            f"{stack}.output_norm": top + "layer_norm.{w}",  # mBART's, M2M100's
        })
    cross = f"{prefix}decoder.layers.{{i}}.encoder_attn"
    out.update({"dec.cross_norm": cross + "_layer_norm.{w}", "dec.cross_q": cross + ".q_proj.{w}",
                "dec.cross_kv": (cross + ".k_proj.{w}", cross + ".v_proj.{w}"),
                "dec.cross_out": cross + ".out_proj.{w}", "logits_bias": "final_logits_bias",
                "output": "lm_head.weight"})
    return out


def bart_shared(prefix: str = "model.") -> tuple[str, ...]:
    """The names of BART's one embedding table (Family.shared)."""
    return (f"{prefix}shared.weight", f"{prefix}encoder.embed_tokens.weight",
            f"{prefix}decoder.embed_tokens.weight")


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
