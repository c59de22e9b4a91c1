"""Gemma 3 (text) and Gemma 2: four norms a block of gain 1 + w, GeGLU, soft caps.

    entry   model_type    class              tinyt features
    GEMMA3  gemma3_text   Gemma3ForCausalLM  q/k norms per head, windowed layers at a rotary
                                             base of their own (every 6th layer global)
    GEMMA2  gemma2        Gemma2ForCausalLM  attention soft cap, every 2nd layer global

The Llama layout with the norms Gemma adds: post_attention_layernorm normalises attention's
output (tinyt's ln_1_out), pre_ / post_feedforward_layernorm the MLP's input and output.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tinyt.config import ModelConfig
from tinyt.hf.common import (
    ROTARY,
    ROTARY_DEFAULTS,
    ROTARY_KEYS,
    head_dim_reader,
    layer_types,
    longrope_misfit,
    read_rope_scaling,
    window_reader,
)
from tinyt.hf.family import Family, Spelling
from tinyt.hf.tensors import LAYER, LLAMA_LAYOUT, weights
from tinyt.hf.tokens import read_tokenizer, special_tokens


def gemma_layer_types(every: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Gemma's windowed layers: config.json's layer_types where it has them, else every layer
    but each `every`-th (Gemma 3's sliding_window_pattern, 6 by default; Gemma 2's 2), as
    their config classes derive them."""
    def read(hf: dict[str, Any]) -> dict[str, Any]:
        n, types = hf["num_hidden_layers"], hf.get("layer_types")
        if types is None:
            pattern = hf.get("sliding_window_pattern", every)
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                     for i in range(n)]
        return window_reader("layer_types", lambda hf, i: False, default=4096)(
            {**hf, "layer_types": types})
    return read


def read_gemma(hf: dict[str, Any]) -> dict[str, Any]:
    """Gemma's scales: embeddings times sqrt(hidden_size), q.k times query_pre_attn_scalar^-1/2
    (256 by default, which is not head_dim^-1/2 in every model), the final logits' soft cap."""
    scalar = hf.get("query_pre_attn_scalar", 256)
    out: dict[str, Any] = {"embedding_multiplier": hf["hidden_size"] ** 0.5,
                           "attention_multiplier": scalar ** -0.5}
    if hf.get("final_logit_softcapping") is not None:
        out["final_softcap"] = hf["final_logit_softcapping"]
    return out


def read_gemma3(hf: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's windowed layers turn at a base of their own, without rope_scaling (where it
    has windowed layers)."""
    if "sliding_window" not in gemma_layer_types(6)(hf):
        return {}
    return {"rope_local_theta": hf.get("rope_local_base_freq", 10000.0)}


def read_gemma2(hf: dict[str, Any]) -> dict[str, Any]:
    """Gemma 2 caps its attention logits (transformers' eager path; its SDPA path drops the
    cap, and tinyt computes the model the checkpoint was trained as)."""
    cap = hf.get("attn_logit_softcapping", 50.0)
    return {} if cap is None else {"attn_softcap": cap}


def bidirectional(hf: dict[str, Any]) -> str | None:
    if hf.get("use_bidirectional_attention"):
        return ("use_bidirectional_attention=True (EmbeddingGemma) attends both ways: an "
                "encoder, not a causal LM tinyt imports as Gemma3ForCausalLM")
    return None


def gemma_rope_scaling(hf: dict[str, Any]) -> str | None:
    """Gemma 2's class has no rope_scaling: one in its config.json is not what it runs."""
    if hf.get("rope_scaling") not in (None, {}):
        return f"rope_scaling={hf['rope_scaling']!r} is not part of Gemma2ForCausalLM"
    return None


def gemma_misfit(cfg: ModelConfig) -> str | None:
    if why := longrope_misfit(cfg):
        return why
    if cfg.embedding_multiplier != math.sqrt(cfg.n_embd):
        return (f"Gemma scales its embeddings by sqrt(hidden_size) = {math.sqrt(cfg.n_embd):g}; "
                f"this one by {cfg.embedding_multiplier!r}")
    if cfg.attention_multiplier is None:
        return "Gemma's attention scale is query_pre_attn_scalar^-1/2, given explicitly"
    scalar = cfg.attention_multiplier ** -2
    if abs(scalar - round(scalar)) > 1e-6 or round(scalar) ** -0.5 != cfg.attention_multiplier:
        return (f"attention_multiplier={cfg.attention_multiplier!r} is not "
                "query_pre_attn_scalar^-1/2 for an integer scalar")
    return None


def _gemma_written(cfg: ModelConfig) -> dict[str, Any]:
    assert cfg.attention_multiplier is not None  # gemma_misfit said so
    return {"intermediate_size": cfg.mlp_width, "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim, "attention_bias": False, "attention_dropout": 0.0,
            "query_pre_attn_scalar": round(cfg.attention_multiplier ** -2),
            "sliding_window": cfg.sliding_window, "layer_types": layer_types(cfg),
            "final_logit_softcapping": cfg.final_softcap, "initializer_range": 0.02,
            "use_cache": True, "pad_token_id": None}


def gemma3_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**_gemma_written(cfg), "rope_scaling": cfg.rope_scaling,
            "rope_local_base_freq": cfg.rope_local_theta, "attn_logit_softcapping": None,
            "use_bidirectional_attention": False}


def gemma2_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**_gemma_written(cfg), "attn_logit_softcapping": cfg.attn_softcap}


GEMMA_WEIGHTS = weights({**LLAMA_LAYOUT,
                         "attn_out_norm": LAYER + "post_attention_layernorm.{w}",
                         "ffn_norm": LAYER + "pre_feedforward_layernorm.{w}",
                         "ffn_out_norm": LAYER + "post_feedforward_layernorm.{w}"})

_GEMMA_FEATURES = {**ROTARY, "bias": False, "norm_offset": 1.0, "post_norms": True}


_GEMMA_HOLDS = {"head_size", "embedding_multiplier", "attention_multiplier", "final_softcap",
                "sliding_window", "full_attention_layers"}


_GEGLU = {"hidden_activation": Spelling("activation", {"gelu_pytorch_tanh": "geglu_tanh"},
                                        default="gelu_pytorch_tanh",
                                        why=" (its gated MLP is GeGLU with tanh GELU)")}


GEMMA3 = Family(  # Gemma 3 text (270M, 1B): four norms a block of gain 1 + w, q/k norms,
    # windowed layers at a rotary base of their own
    model_type="gemma3_text", architecture="Gemma3ForCausalLM",
    keys=ROTARY_KEYS,
    defaults={**ROTARY_DEFAULTS, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
              "tie_word_embeddings": True},
    spelled=_GEGLU, features={**_GEMMA_FEATURES, "qk_norm": "head"},
    fixed={"attention_bias": False}, refuses=(bidirectional,),
    reads=(read_rope_scaling, head_dim_reader(256), read_gemma, gemma_layer_types(6),
           read_gemma3),
    holds=frozenset(_GEMMA_HOLDS | {"rope_scaling", "rope_local_theta"}), misfit=gemma_misfit,
    weights=GEMMA_WEIGHTS, base="model.", buffers=("rotary_emb.inv_freq",
                                                  "rotary_emb_local.inv_freq"),
    read_tokenizer=read_tokenizer, special_tokens=special_tokens, written=gemma3_written,
)


GEMMA2 = Family(  # Gemma 2: the same blocks without q/k norms, one rotary base, soft caps
    model_type="gemma2", architecture="Gemma2ForCausalLM",
    keys=ROTARY_KEYS,
    defaults={**ROTARY_DEFAULTS, "max_position_embeddings": 8192,
              "tie_word_embeddings": True},
    spelled=_GEGLU, features=_GEMMA_FEATURES,
    fixed={"attention_bias": False}, refuses=(gemma_rope_scaling,),
    reads=(head_dim_reader(256), read_gemma, gemma_layer_types(2), read_gemma2),
    holds=frozenset(_GEMMA_HOLDS | {"attn_softcap"}), misfit=gemma_misfit,
    weights=GEMMA_WEIGHTS, base="model.", buffers=("rotary_emb.inv_freq",),
    read_tokenizer=read_tokenizer, special_tokens=special_tokens, written=gemma2_written,
)
