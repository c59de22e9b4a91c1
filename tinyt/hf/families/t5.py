"""T5 (T5ForConditionalGeneration): v1.0 (t5-small ...) and v1.1 / Flan-T5. Pre-norm RMSNorms
without biases, no 1/sqrt(d) in attention (attention_multiplier 1.0), positions as T5's
relative bias: a learned scalar per head and distance bucket in each stack's block 0
(relative_attention_bias), shared by its layers (tinyt's encoder.rel / decoder.rel).

    version     feed_forward_proj   MLP                            head
    v1.0        relu                wo(relu(wi x))                 tied, its input times
                                                                   d_model^-0.5 (logits_scaling)
    v1.1, Flan  gated-gelu          wo(gelu_new(wi_0 x) * wi_1 x)  lm_head of its own

d_kv (the head's width) need not be d_model / num_heads (Flan-T5-small: 6 x 64 = 384 of 512):
head_size. T5 has no context of its own; n_positions (512, its training length) is tinyt's
block_size. Generation: decoder_start_token_id (the pad, 0) is ModelConfig.decoder_start_id;
the end (</s>, 1) is the tokenizer's EOS and the padding its <pad>.
"""
from __future__ import annotations

import math
from typing import Any

from tinyt.config import ModelConfig
from tinyt.hf.common import SEQ2SEQ_HOLDS, bad_words, decoder_start
from tinyt.hf.family import Family, Spelling, Weight
from tinyt.hf.tensors import OURS, weights
from tinyt.hf.tokens import read_seq2seq_tokenizer, seq2seq_special_tokens
from tinyt.hf.weights import gate_up_rows


def t5_weights() -> tuple[Weight, ...]:
    """T5's tensors: each stack's layer.0 self-attention, the decoder's layer.1 cross-attention,
    the last layer's MLP (wi, or v1.1's gated wi_0 | wi_1 stacked)."""
    table: dict[str, str | tuple[str, ...]] = {}
    mlps = []
    for stack, name, ff in (("enc", "encoder", 1), ("dec", "decoder", 2)):
        block = f"{name}.block.{{i}}."
        attn = block + "layer.0.SelfAttention."
        table.update({
            f"{stack}.token_embd": f"{name}.embed_tokens.weight",
            f"{stack}.attn_rel_b": f"{name}.block.0.layer.0.SelfAttention."
                                   "relative_attention_bias.weight",
            f"{stack}.attn_norm": block + "layer.0.layer_norm.{w}",
            f"{stack}.attn_qkv": tuple(attn + f"{p}.{{w}}" for p in "qkv"),
            f"{stack}.attn_out": attn + "o.{w}",
            f"{stack}.ffn_norm": block + f"layer.{ff}.layer_norm.{{w}}",
            f"{stack}.ffn_down": block + f"layer.{ff}.DenseReluDense.wo.{{w}}",
            f"{stack}.output_norm": f"{name}.final_layer_norm.{{w}}",
        })
        dense = block + f"layer.{ff}.DenseReluDense."
        mlps += [Weight(OURS[f"{stack}.ffn_up"], (dense + "wi.{w}",),
                        when=lambda cfg: not cfg.gated_mlp),
                 Weight(OURS[f"{stack}.ffn_up"], (dense + "wi_0.{w}", dense + "wi_1.{w}"),
                        rows=gate_up_rows, when=lambda cfg: cfg.gated_mlp)]
    cross = "decoder.block.{i}.layer.1."
    table.update({"dec.cross_norm": cross + "layer_norm.{w}",
                  "dec.cross_q": cross + "EncDecAttention.q.{w}",
                  "dec.cross_kv": (cross + "EncDecAttention.k.{w}",
                                   cross + "EncDecAttention.v.{w}"),
                  "dec.cross_out": cross + "EncDecAttention.o.{w}",
                  "output": "lm_head.weight"})
    return weights(table) + tuple(mlps)


def read_t5(hf: dict[str, Any]) -> dict[str, Any]:
    """The decoder's blocks (num_decoder_layers; absent: num_layers), the head's width d_kv
    where it is not d_model / num_heads, and the tied head's d_model^-0.5."""
    layers, heads, width = hf["num_layers"], hf["num_heads"], hf["d_model"]
    dec, d_kv = hf.get("num_decoder_layers"), hf.get("d_kv", 64)
    tied = hf.get("tie_word_embeddings", True)
    return {"n_decoder_layer": None if dec is None or dec == layers else dec,
            "head_size": None if d_kv * heads == width else d_kv,
            "logits_scaling": math.sqrt(width) if tied else 1.0}


def t5_misfit(cfg: ModelConfig) -> str | None:
    want = math.sqrt(cfg.n_embd) if cfg.tie_weights else 1.0
    if cfg.logits_scaling != want:
        return (f"its {'tied' if cfg.tie_weights else 'untied'} head has logits_scaling="
                f"{cfg.logits_scaling}; T5's is {want:g} (d_model^0.5 when tied, else 1)")
    return None


def t5_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {"num_decoder_layers": cfg.decoder_layers, "d_kv": cfg.head_dim,
            "d_ff": cfg.mlp_width, "decoder_start_token_id": cfg.decoder_start_id,
            "dropout_rate": 0.0, "bos_token_id": None, "use_cache": True,
            **({"bad_words_ids": [[i] for i in cfg.bad_word_ids]} if cfg.bad_word_ids else {})}


T5 = Family(
    model_type="t5", architecture="T5ForConditionalGeneration",
    keys={"d_model": "n_embd", "num_layers": "n_layer", "num_heads": "n_head",
          "d_ff": "n_inner", "vocab_size": "vocab_size", "layer_norm_epsilon": "norm_eps",
          "relative_attention_num_buckets": "relative_buckets",
          "relative_attention_max_distance": "relative_max_distance",
          "tie_word_embeddings": "tie_weights", "n_positions": "block_size",
          "forced_bos_token_id": "forced_bos_id"},
    defaults={"layer_norm_epsilon": 1e-6, "relative_attention_num_buckets": 32,
              "relative_attention_max_distance": 128, "tie_word_embeddings": True,
              "n_positions": 512, "forced_bos_token_id": None},
    spelled={"feed_forward_proj": Spelling("activation", {
        "relu": "relu", "gated-gelu": "geglu_tanh", "gated-gelu_new": "geglu_tanh",
        "gated-silu": "swiglu", "gelu": "gelu", "gelu_new": "gelu_tanh"}, default="relu",
        why=" (T5's MLPs tinyt runs)")},
    features={"task": "seq2seq", "norm": "rmsnorm", "bias": False, "pos_encoding": "relative",
              "norm_placement": "pre", "attention_multiplier": 1.0,
              "shared_embeddings": True},
    reads=(bad_words, read_t5,
           decoder_start(lambda hf: hf.get("pad_token_id", 0))),  # T5's: the pad
    holds=SEQ2SEQ_HOLDS | {"head_size", "relative_buckets", "relative_max_distance",
                           "logits_scaling"},
    misfit=t5_misfit, written=t5_written,
    weights=t5_weights(), base="", shared=("shared.weight", "encoder.embed_tokens.weight",
                                           "decoder.embed_tokens.weight"),
    read_tokenizer=read_seq2seq_tokenizer, special_tokens=seq2seq_special_tokens,
    task="seq2seq",
)
