"""What several families' config.json files share, read and written the same way: the
rotary layouts' keys and defaults, rope_scaling, head_dim, sliding windows, biases; the
encoder-decoders' stacks, embedding scale and decoder start (BART's keys, which mBART, Marian
and M2M100 / NLLB share).

A family file (tinyt/hf/families/) takes these by name; what is one family's alone stays in
its file.
"""
from __future__ import annotations

import math
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


# -- encoder-decoders -----------------------------------------------------------------------------
# BART's config.json keys (mBART's, Marian's, M2M100's), and transformers' defaults of those a
# file may leave out. The decoder's own keys are read (decoder_layers) or must equal the
# encoder's (same_stacks): tinyt's two stacks have one width, head count and MLP width.
BART_KEYS = {"d_model": "n_embd", "encoder_layers": "n_layer",
             "encoder_attention_heads": "n_head", "encoder_ffn_dim": "n_inner",
             "max_position_embeddings": "block_size", "vocab_size": "vocab_size",
             "tie_word_embeddings": "tie_weights", "forced_bos_token_id": "forced_bos_id"}
BART_DEFAULTS = {"max_position_embeddings": 1024, "tie_word_embeddings": True,
                 "forced_bos_token_id": None}
# activation_function: transformers' ACT2FN names of the functions tinyt's MLP runs (swish is
# Marian's spelling of SiLU; the first name of each is the one written back)
ACT_FN = Spelling("activation", {"gelu": "gelu", "relu": "relu", "swish": "silu",
                                 "silu": "silu", "gelu_new": "gelu_tanh",
                                 "gelu_pytorch_tanh": "gelu_tanh"}, default="gelu")
SEQ2SEQ_HOLDS = frozenset({"n_decoder_layer", "decoder_start_id", "forced_bos_id",
                           "bad_word_ids"})


def same_stacks(hf: dict[str, Any]) -> str | None:
    for enc, dec in (("encoder_attention_heads", "decoder_attention_heads"),
                     ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(dec, hf.get(enc)) != hf.get(enc):
            return (f"{dec}={hf[dec]} with {enc}={hf.get(enc)} is not implemented: tinyt's "
                    "decoder has the encoder's heads and MLP width")
    return None


def decoder_layers(enc: str, dec: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The decoder's blocks (`dec`; absent: as many as the encoder's `enc`): n_decoder_layer,
    null where they are as many."""
    def read(hf: dict[str, Any]) -> dict[str, Any]:
        n = hf.get(dec)
        return {"n_decoder_layer": None if n is None or n == hf[enc] else n}
    return read


def embedding_scale(default: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """scale_embedding (`default` where config.json leaves it out): token embeddings times
    sqrt(d_model)."""
    def read(hf: dict[str, Any]) -> dict[str, Any]:
        return {"embedding_multiplier": math.sqrt(hf["d_model"])
                if hf.get("scale_embedding", default) else 1.0}
    return read


def scale_misfit(cfg: ModelConfig) -> str | None:
    if cfg.embedding_multiplier not in (1.0, math.sqrt(cfg.n_embd)):
        return (f"its embedding_multiplier={cfg.embedding_multiplier} is neither 1 nor "
                "sqrt(d_model) (scale_embedding)")
    return None


def decoder_start(default: Callable[[dict[str, Any]], int | None]
                  ) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """decoder_start_token_id (the class's `default` where config.json leaves it out: Marian's
    and T5's pad, BART's 2), else bos_token_id, as transformers' generate falls back."""
    def read(hf: dict[str, Any]) -> dict[str, Any]:
        start = hf.get("decoder_start_token_id")
        start = default(hf) if start is None else start
        start = hf.get("bos_token_id") if start is None else start
        if not isinstance(start, int) or isinstance(start, bool):
            raise ConversionError(f"decoder_start_token_id={start!r}: an encoder-decoder needs "
                                  "the id its decoder starts at (an integer)")
        return {"decoder_start_id": start}
    return read


def bad_words(hf: dict[str, Any]) -> dict[str, Any]:
    """bad_words_ids (generation_config.json's, else config.json's): the ids never generated,
    each a one-token sequence (Opus-MT's [[pad]]); a longer sequence is refused by name."""
    words = hf.get("bad_words_ids") or []
    if not (isinstance(words, list) and all(
            isinstance(w, list) and len(w) == 1 and isinstance(w[0], int)
            and not isinstance(w[0], bool) for w in words)):
        raise ConversionError(f"bad_words_ids={words!r} is not implemented: tinyt bans single "
                              "tokens ([[id], ...]), not sequences of several")
    return {"bad_word_ids": tuple(w[0] for w in words)}


def decoder_vocab(hf: dict[str, Any]) -> str | None:
    size = hf.get("decoder_vocab_size")
    if size is not None and size != hf.get("vocab_size"):
        return (f"decoder_vocab_size={size} with vocab_size={hf.get('vocab_size')} is not "
                "implemented: a target vocabulary of its own (tinyt's stacks share one "
                "vocab_size)")
    return None


def bart_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    """BART's keys besides the mapped ones (mBART's, Marian's, M2M100's): the decoder's, the
    MLP widths resolved, no dropout, the forced end at max_length transformers' classes set."""
    return {"decoder_layers": cfg.decoder_layers, "decoder_attention_heads": cfg.n_head,
            "encoder_ffn_dim": cfg.mlp_width, "decoder_ffn_dim": cfg.mlp_width,
            "scale_embedding": cfg.embedding_multiplier != 1.0,
            "decoder_start_token_id": cfg.decoder_start_id, "forced_eos_token_id": eos_id,
            **({"bad_words_ids": [[i] for i in cfg.bad_word_ids]} if cfg.bad_word_ids else {}),
            "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
            "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "use_cache": True}
