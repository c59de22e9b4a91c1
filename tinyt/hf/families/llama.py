"""The Llama layout: Llama, Qwen2 / Qwen3, Mistral, SmolLM3, Granite.

    entry     model_type  class              tinyt features
    LLAMA     llama       LlamaForCausalLM   RMSNorm, rotary, SwiGLU, n_kv_head, biases: all|none
    QWEN2     qwen2       Qwen2ForCausalLM   as Llama, biases on q, k, v only; lower layers full
    QWEN3     qwen3       Qwen3ForCausalLM   q/k norms per head, head_dim of its own
    MISTRAL   mistral     MistralForCausalLM a sliding window over every layer
    SMOLLM3   smollm3     SmolLM3ForCausalLM layers without rotary positions
    GRANITE   granite     GraniteForCausalLM four multipliers

The layout splits what tinyt fuses (tinyt/hf/tensors.py's LLAMA_LAYOUT):

    HF  self_attn.q_proj [nh*hs, C]  k_proj [nkv*hs, C]  v_proj [nkv*hs, C]
    tinyt  attn.c_attn = rows of q, k, v stacked            [(nh + 2 nkv) * hs, C]
    HF  mlp.gate_proj [I, C]  up_proj [I, C]   ->  tinyt  mlp.c_fc = gate rows, then up
"""
from __future__ import annotations

from typing import Any

from tinyt.config import ModelConfig
from tinyt.errors import ConversionError
from tinyt.hf.common import (
    BIASES,
    NO_BIASES,
    ROTARY,
    ROTARY_DEFAULTS,
    ROTARY_KEYS,
    SILU,
    head_dim_reader,
    layer_types,
    longrope_misfit,
    read_rope_scaling,
    rotary_written,
    split_biases,
    window_reader,
)
from tinyt.hf.family import Family
from tinyt.hf.tensors import LLAMA_LAYOUT, weights
from tinyt.hf.tokens import read_tokenizer, special_tokens


def qwen_windowed(hf: dict[str, Any], i: int) -> bool:
    return i >= hf.get("max_window_layers", 28)  # Qwen2Config's default


def read_nope_layers(hf: dict[str, Any]) -> dict[str, Any]:
    """SmolLM3: `no_rope_layers` holds 1 for a layer WITH rotary, 0 without; absent, every
    `no_rope_layer_interval`-th layer (4 by default) has none."""
    n, flags = hf["num_hidden_layers"], hf.get("no_rope_layers")
    if flags is None:
        every = hf.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % every != 0) for i in range(n)]
    if len(flags) != n or any(f not in (0, 1) for f in flags):
        raise ConversionError(f"no_rope_layers={flags!r} must hold a 0 or 1 for each of the "
                              f"{n} layers")
    return {"nope_layers": tuple(i for i, f in enumerate(flags) if not f)}


def sliding_window(hf: dict[str, Any]) -> str | None:
    """Llama's attention has no window: a config asking for one is not a Llama tinyt runs."""
    if hf.get("use_sliding_window") or hf.get("sliding_window"):
        return (f"sliding-window attention (sliding_window={hf.get('sliding_window')}) is not "
                "part of LlamaForCausalLM; a windowed model is a MistralForCausalLM")
    return None


def uneven_heads(hf: dict[str, Any]) -> str | None:
    heads, width, head_dim = hf["num_attention_heads"], hf["hidden_size"], hf.get("head_dim")
    if head_dim is None or not isinstance(heads, int) or head_dim * heads == width:
        return None
    return (f"head_dim={head_dim} with {heads} heads is not hidden_size={width}: Qwen2's "
            "config class has no head_dim key, and tinyt writes what it can read back")


def llama_misfit(cfg: ModelConfig) -> str | None:
    if why := longrope_misfit(cfg):
        return why
    if cfg.bias and cfg.qkv_bias is False:
        return ("bias=True with qkv_bias=False (biases everywhere but q, k, v) has no Hugging "
                "Face Llama-family layout")
    if not cfg.bias and cfg.qkv_bias:
        return "biases on q, k, v alone (qkv_bias=True, bias=False) are Qwen2's layout"
    return None


def mistral_misfit(cfg: ModelConfig) -> str | None:
    if cfg.full_attention_layers:
        return (f"MistralForCausalLM's window covers every layer; this one leaves out "
                f"{list(cfg.full_attention_layers)}")
    return llama_misfit(cfg)


def llama_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**rotary_written(cfg), "pretraining_tp": 1}


def qwen2_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    local = [i for i in range(cfg.n_layer) if cfg.windowed(i)]
    return {**rotary_written(cfg), "use_sliding_window": cfg.sliding_window is not None,
            "sliding_window": cfg.sliding_window, "layer_types": layer_types(cfg),
            "max_window_layers": local[0] if local else cfg.n_layer}


def mistral_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    out = {**rotary_written(cfg), "sliding_window": cfg.sliding_window}
    if cfg.rope_scaling is None:
        del out["rope_scaling"]  # MistralConfig has no such key
    return out


def smollm3_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**rotary_written(cfg), "use_sliding_window": cfg.sliding_window is not None,
            "sliding_window": cfg.sliding_window, "layer_types": layer_types(cfg),
            "no_rope_layers": [int(cfg.rotary_layer(i)) for i in range(cfg.n_layer)],
            "no_rope_layer_interval": 4,
            "pad_token_id": None}  # SmolLM3Config's default is Llama 3's id 128004


def granite_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    scale = cfg.attention_multiplier
    return {**rotary_written(cfg),  # Granite's attention_multiplier is always explicit
            "attention_multiplier": cfg.head_dim ** -0.5 if scale is None else scale}


LLAMA_WEIGHTS = weights(LLAMA_LAYOUT)
LLAMA_LIKE = dict(spelled=SILU, weights=LLAMA_WEIGHTS, base="model.",
                  buffers=("rotary_emb.inv_freq",), read_tokenizer=read_tokenizer,
                  special_tokens=special_tokens)

LLAMA = Family(
    model_type="llama", architecture="LlamaForCausalLM",
    keys={**ROTARY_KEYS, **BIASES}, defaults={**ROTARY_DEFAULTS, **NO_BIASES},
    features=ROTARY, refuses=(sliding_window, split_biases), misfit=llama_misfit,
    reads=(read_rope_scaling, head_dim_reader(None)),
    holds=frozenset({"rope_scaling", "head_size"}), written=llama_written, **LLAMA_LIKE,
)


QWEN_WINDOW = window_reader("use_sliding_window", qwen_windowed)


QWEN2 = Family(
    model_type="qwen2", architecture="Qwen2ForCausalLM",
    keys=ROTARY_KEYS, defaults={**ROTARY_DEFAULTS, "max_position_embeddings": 32768},
    features={**ROTARY, "bias": False, "qkv_bias": True},
    refuses=(uneven_heads,), reads=(read_rope_scaling, QWEN_WINDOW), misfit=longrope_misfit,
    holds=frozenset({"rope_scaling", "sliding_window", "full_attention_layers"}),
    written=qwen2_written, **LLAMA_LIKE,
)


QWEN3 = Family(  # Qwen2 with q/k norms, head_dim of its own and no q, k, v biases
    model_type="qwen3", architecture="Qwen3ForCausalLM",
    keys=ROTARY_KEYS, defaults={**ROTARY_DEFAULTS, "max_position_embeddings": 32768},
    features={**ROTARY, "bias": False, "qk_norm": "head"},
    fixed={"attention_bias": False}, misfit=longrope_misfit,
    reads=(read_rope_scaling, head_dim_reader(128), QWEN_WINDOW),
    holds=frozenset({"rope_scaling", "head_size", "sliding_window", "full_attention_layers"}),
    written=qwen2_written, **LLAMA_LIKE,
)


MISTRAL = Family(  # Llama with a sliding window over every layer
    model_type="mistral", architecture="MistralForCausalLM",
    keys=ROTARY_KEYS, defaults={**ROTARY_DEFAULTS, "max_position_embeddings": 4096 * 32},
    features={**ROTARY, "bias": False},
    reads=(read_rope_scaling, head_dim_reader(None),
           window_reader(None, lambda hf, i: True, default=4096)),  # MistralConfig's window
    holds=frozenset({"rope_scaling", "head_size", "sliding_window"}), misfit=mistral_misfit,
    written=mistral_written, **LLAMA_LIKE,
)


SMOLLM3 = Family(  # Llama with layers that have no rotary positions
    model_type="smollm3", architecture="SmolLM3ForCausalLM",
    keys={**ROTARY_KEYS, **BIASES},
    defaults={**ROTARY_DEFAULTS, **NO_BIASES, "max_position_embeddings": 32768,
              "rope_theta": 2000000.0, "tie_word_embeddings": True},  # PretrainedConfig's tie
    features=ROTARY, refuses=(split_biases,), misfit=llama_misfit,  # windows by layer_types
    reads=(read_rope_scaling, head_dim_reader(None), read_nope_layers,
           window_reader("use_sliding_window",  # its window is on the layers without rotary
                         lambda hf, i: i in read_nope_layers(hf)["nope_layers"])),
    holds=frozenset({"rope_scaling", "head_size", "nope_layers", "sliding_window",
                     "full_attention_layers"}),
    written=smollm3_written, **LLAMA_LIKE,
)


GRANITE = Family(  # Llama with four multipliers
    model_type="granite", architecture="GraniteForCausalLM",
    keys={**ROTARY_KEYS, **BIASES, "embedding_multiplier": "embedding_multiplier",
          "residual_multiplier": "residual_multiplier",
          "attention_multiplier": "attention_multiplier", "logits_scaling": "logits_scaling"},
    defaults={**ROTARY_DEFAULTS, **NO_BIASES, "embedding_multiplier": 1.0,
              "residual_multiplier": 1.0, "attention_multiplier": 1.0, "logits_scaling": 1.0},
    features=ROTARY, refuses=(split_biases,), misfit=llama_misfit,
    reads=(read_rope_scaling, head_dim_reader(None)),
    holds=frozenset({"rope_scaling", "head_size", "embedding_multiplier", "residual_multiplier",
                     "attention_multiplier", "logits_scaling"}),
    written=granite_written, **LLAMA_LIKE,
)
