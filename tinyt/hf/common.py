"""What several families' config.json files share, read and written the same way: the
rotary layouts' keys and defaults, rope_scaling, head_dim, sliding windows, biases.

A family file (tinyt/hf/families/) takes these by name; what is one family's alone stays in
its file.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tinyt.config import ModelConfig, rope_parameters
from tinyt.errors import ConversionError
from tinyt.hf.family import Spelling

# the Llama layouts' config.json keys, and transformers' defaults of those a file may leave out
ROTARY_KEYS = {"hidden_size": "n_embd", "intermediate_size": "n_inner",
               "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
               "num_key_value_heads": "n_kv_head", "max_position_embeddings": "block_size",
               "vocab_size": "vocab_size", "rms_norm_eps": "norm_eps", "rope_theta": "rope_theta",
               "tie_word_embeddings": "tie_weights"}
ROTARY_DEFAULTS = {"num_key_value_heads": None, "max_position_embeddings": 2048,
                   "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}
SILU = {"hidden_act": Spelling("activation", {"silu": "swiglu"}, default="silu",
                               why=" (its gated MLP is SwiGLU)")}
ROTARY = {"norm": "rmsnorm", "pos_encoding": "rotary"}
BIASES = {"attention_bias": "bias", "mlp_bias": "bias"}  # Llama's: all or none (split_biases)
NO_BIASES = {"attention_bias": False, "mlp_bias": False}


def read_rope_scaling(hf: dict[str, Any]) -> dict[str, Any]:
    """transformers' rope_scaling as it is (validated by ModelConfig: linear, dynamic, llama3,
    yarn; another type is refused by name). `type` is the older spelling of `rope_type`."""
    scaling = hf.get("rope_scaling")
    if scaling is None:
        return {}
    if not isinstance(scaling, dict):
        raise ConversionError(f"rope_scaling={scaling!r} is not an object")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return {}
    if kind == "longrope":
        raise ConversionError("rope_scaling type 'longrope' is read for Phi3ForCausalLM only: "
                              "the class whose switch to the long factors (at "
                              "original_max_position_embeddings, the cache recomputed) tinyt "
                              "matches")
    params = {k: v for k, v in scaling.items() if k not in ("type", "rope_type", "rope_theta")}
    if kind == "dynamic" and "original_max_position_embeddings" in params:
        params.pop("original_max_position_embeddings")  # unread by transformers' dynamic
    return {"rope_scaling": {"rope_type": kind, **params}}


def head_dim_reader(default: int | None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """head_dim, when it is not hidden_size / heads (Qwen3's default is 128 whatever the
    width)."""
    def read(hf: dict[str, Any]) -> dict[str, Any]:
        head_dim = hf.get("head_dim", default)
        heads, width = hf["num_attention_heads"], hf["hidden_size"]
        if head_dim is None or head_dim * heads == width:
            return {}
        return {"head_size": head_dim}
    return read


def window_reader(switch: str | None, windowed: Callable[[dict[str, Any], int], bool],
                  default: int | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The sliding window and the layers it leaves out. `switch` is the key that turns the
    window on (Qwen2's use_sliding_window; None: the window's size alone, Mistral's);
    layer_types says which layers use it where config.json has it, else `windowed(hf, i)`;
    `default` is the class's window when config.json leaves the key out (Mistral's 4096)."""
    def read(hf: dict[str, Any]) -> dict[str, Any]:
        window = hf.get("sliding_window", default)
        if switch is not None and not hf.get(switch):
            window = None
        n = hf["num_hidden_layers"]
        types = hf.get("layer_types") if switch is not None else None
        if types is not None:
            odd = sorted({t for t in types} - {"full_attention", "sliding_attention"})
            if odd or len(types) != n:
                raise ConversionError(f"layer_types {odd or types} is not implemented: tinyt's "
                                      "layers are 'full_attention' or 'sliding_attention', one "
                                      "per layer")
            local = [t == "sliding_attention" for t in types]
        else:
            local = [windowed(hf, i) for i in range(n)]
        if window is None or not any(local):
            if window is None and any(local) and types is not None:
                raise ConversionError(f"layer_types has sliding layers but sliding_window is "
                                      f"{hf.get('sliding_window')!r}")
            return {}
        return {"sliding_window": window,
                "full_attention_layers": tuple(i for i in range(n) if not local[i])}
    return read


def split_biases(hf: dict[str, Any]) -> str | None:
    attn, mlp = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    if attn == mlp:
        return None
    return (f"attention_bias={attn} with mlp_bias={mlp} is not implemented: tinyt's biases are "
            "on every projection or none")


def longrope_misfit(cfg: ModelConfig) -> str | None:
    """LongRoPE's switch at the original context is Phi-3's: the other classes switch at
    max_position_embeddings and keep the cache made at the short frequencies."""
    if cfg.rope_scaling is not None and rope_parameters(cfg)[0] == "longrope":
        return "its longrope rotary is Phi3ForCausalLM's"
    return None


def rotary_written(cfg: ModelConfig) -> dict[str, Any]:
    # resolved, not tinyt's None: LlamaConfig's defaults are Llama-7B's
    return {"intermediate_size": cfg.mlp_width, "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim, "rope_scaling": cfg.rope_scaling, "attention_dropout": 0.0,
            "initializer_range": 0.02, "use_cache": True}


def layer_types(cfg: ModelConfig) -> list[str]:
    return ["sliding_attention" if cfg.windowed(i) else "full_attention"
            for i in range(cfg.n_layer)]


def no_pooling(hf: dict[str, Any]) -> dict[str, Any]:
    """A bare base model gives hidden states only: how its tokens make a sentence is a
    sentence-transformers directory's Pooling (read over this), or a head's."""
    return {"pooling": None}
