"""OLMo-2 (Olmo2ForCausalLM): the Llama layout with its norms moved after the branches.

    x = x + post_attention_layernorm(attn(x))       no norm of the branch's input
    x = x + post_feedforward_layernorm(mlp(x))      (tinyt: pre_norms=False, post_norms=True)
    q = q_norm(q_proj(x)), k = k_norm(k_proj(x))    over the whole projection, before the
                                                    heads split (qk_norm='projection')
"""
from __future__ import annotations

from typing import Any

from tinyt.config import ModelConfig
from tinyt.hf.common import (
    ROTARY,
    ROTARY_DEFAULTS,
    ROTARY_KEYS,
    SILU,
    head_dim_reader,
    longrope_misfit,
    read_rope_scaling,
    rotary_written,
)
from tinyt.hf.family import Family
from tinyt.hf.tensors import LAYER, LLAMA_LAYOUT, weights
from tinyt.hf.tokens import read_tokenizer, special_tokens

OLMO2_WEIGHTS = weights({
    **{role: name for role, name in LLAMA_LAYOUT.items() if role not in ("attn_norm", "ffn_norm")},
    "attn_out_norm": LAYER + "post_attention_layernorm.{w}",
    "ffn_out_norm": LAYER + "post_feedforward_layernorm.{w}",
})


def olmo2_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**rotary_written(cfg), "pad_token_id": None}  # Olmo2Config's 1 is a real token


OLMO2 = Family(
    model_type="olmo2", architecture="Olmo2ForCausalLM",
    keys=ROTARY_KEYS, defaults={**ROTARY_DEFAULTS, "rms_norm_eps": 1e-5},
    features={**ROTARY, "bias": False, "qk_norm": "projection", "pre_norms": False,
              "post_norms": True},
    fixed={"attention_bias": False},  # its MLP has none: tinyt's biases are all or none
    reads=(read_rope_scaling, head_dim_reader(None)), misfit=longrope_misfit,
    holds=frozenset({"rope_scaling", "head_size"}), written=olmo2_written,
    spelled=SILU, weights=OLMO2_WEIGHTS, base="model.", buffers=("rotary_emb.inv_freq",),
    read_tokenizer=read_tokenizer, special_tokens=special_tokens,
)
