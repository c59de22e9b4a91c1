"""Phi-3 / 3.5 / Phi-4-mini (Phi3ForCausalLM): the Llama layout with q, k, v and gate, up
already fused (qkv_proj, gate_up_proj: tinyt's row order), LongRoPE switching at the original
context, partial rotary (Phi-4-mini's 96 of 128 dims) and a window over every layer.
"""
from __future__ import annotations

from typing import Any

from tinyt.config import ModelConfig, rope_parameters
from tinyt.errors import ConversionError
from tinyt.hf.common import (
    ROTARY,
    ROTARY_DEFAULTS,
    ROTARY_KEYS,
    SILU,
    head_dim_reader,
    rotary_written,
    window_reader,
)
from tinyt.hf.family import Family
from tinyt.hf.tensors import LAYER, LLAMA_LAYOUT, weights
from tinyt.hf.tokens import phi3_special_tokens, read_tokenizer

PHI3_ORIGINAL = 4096  # Phi3Config's original_max_position_embeddings when config.json omits it


def read_longrope(hf: dict[str, Any]) -> dict[str, Any]:
    """Phi-3's rope_scaling: LongRoPE ('su' and 'yarn' are its older names in Phi3Config),
    with the original context and factor = max_position_embeddings / original, the source of
    the attention factor, kept whatever context tinyt keeps."""
    scaling = hf.get("rope_scaling")
    if not scaling:
        return {}
    if not isinstance(scaling, dict):
        raise ConversionError(f"rope_scaling={scaling!r} is not an object")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in ("longrope", "su", "yarn"):
        raise ConversionError(f"rope_scaling type {kind!r} is not Phi-3's: Phi3ForCausalLM "
                              "runs 'longrope'")
    original = hf.get("original_max_position_embeddings", PHI3_ORIGINAL)
    return {"rope_scaling": {
        "rope_type": "longrope", "long_factor": list(scaling["long_factor"]),
        "short_factor": list(scaling["short_factor"]),
        "original_max_position_embeddings": original,
        "factor": hf.get("max_position_embeddings", PHI3_ORIGINAL) / original}}


def read_partial_rotary(hf: dict[str, Any]) -> dict[str, Any]:
    """partial_rotary_factor: rotary turns the first int(head_dim * factor) dims of a head."""
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    dims = int(head_dim * hf.get("partial_rotary_factor", 1.0))
    return {} if dims == head_dim else {"rotary_dim": dims}


def phi3_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    """Phi3Config's rope_scaling holds exactly type, short_factor and long_factor; the
    original context and max_position_embeddings (original x factor, whatever context tinyt
    kept: transformers' attention factor is read from their ratio) sit beside it."""
    out = {**rotary_written(cfg), "partial_rotary_factor": cfg.rotary_dims / cfg.head_dim,
           "sliding_window": cfg.sliding_window, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
           "pad_token_id": None,  # Phi3Config's 32000 would index past a smaller vocabulary
           "original_max_position_embeddings": cfg.block_size}
    if cfg.rope_scaling is not None:
        _, p = rope_parameters(cfg)
        original = p["original_max_position_embeddings"]
        out.update(rope_scaling={"type": "longrope", "short_factor": list(p["short_factor"]),
                                 "long_factor": list(p["long_factor"])},
                   original_max_position_embeddings=original,
                   max_position_embeddings=round(p["factor"] * original))
    return out


def phi3_misfit(cfg: ModelConfig) -> str | None:
    if cfg.rope_scaling is not None and rope_parameters(cfg)[0] != "longrope":
        return (f"Phi3ForCausalLM's rope_scaling is longrope; this one is "
                f"{rope_parameters(cfg)[0]!r}")
    if cfg.rope_scaling is not None and "attention_factor" in cfg.rope_scaling:
        return "Phi3Config derives longrope's attention factor; this one sets it"
    if cfg.full_attention_layers:
        return (f"Phi3ForCausalLM's window covers every layer; this one leaves out "
                f"{list(cfg.full_attention_layers)}")
    return None


PHI3_WEIGHTS = weights({  # no q/k norms; q, k, v and gate, up fused as tinyt fuses them
    **{role: name for role, name in LLAMA_LAYOUT.items()
       if role not in ("attn_q_norm", "attn_k_norm")},
    "attn_qkv": LAYER + "self_attn.qkv_proj.{w}", "ffn_up": LAYER + "mlp.gate_up_proj.{w}"})

PHI3 = Family(  # Phi-3 / 3.5 / Phi-4-mini: fused projections, LongRoPE, partial rotary
    model_type="phi3", architecture="Phi3ForCausalLM",
    keys=ROTARY_KEYS,
    defaults={**ROTARY_DEFAULTS, "max_position_embeddings": PHI3_ORIGINAL,
              "rms_norm_eps": 1e-5},
    features={**ROTARY, "bias": False},
    reads=(read_longrope, head_dim_reader(None), read_partial_rotary,
           window_reader(None, lambda hf, i: True)),  # its window covers every layer
    holds=frozenset({"rope_scaling", "head_size", "sliding_window", "rotary_dim"}),
    misfit=phi3_misfit, written=phi3_written,
    spelled=SILU, weights=PHI3_WEIGHTS, base="model.", buffers=("rotary_emb.inv_freq",),
    read_tokenizer=read_tokenizer, special_tokens=phi3_special_tokens,
)
