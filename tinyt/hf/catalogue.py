"""The Hugging Face architectures tinyt reads and writes: one `Family` entry each.

    entry     model_type  class              tinyt features
    GPT2      gpt2        GPT2LMHeadModel    learned positions, LayerNorm, GELU, fused Conv1D
    LLAMA     llama       LlamaForCausalLM   RMSNorm, rotary, SwiGLU, n_kv_head, biases: all|none
    QWEN2     qwen2       Qwen2ForCausalLM   as Llama, biases on q, k, v only
    (and Mistral, Qwen3, SmolLM3, Granite: Llama with a window, q/k norms, layers without
    rotary, multipliers; Gemma 3 and Gemma 2 below)

GPT-2 is tinyt's own architecture in another layout: the same names (a GPT2Model save lacks
`transformer.`), its projections `Conv1D` [in, out], biases always (a bias-free model writes
zeros, and the `tinyt` block of config.json says so), `activation_function` "gelu" the exact
erf GELU and "gelu_new" / "gelu_pytorch_tanh" / "gelu_fast" its tanh form. The Llama layouts
(SmolLM2, TinyLlama, Llama-3.2; Qwen2 / Qwen2.5) split what tinyt fuses:

    HF  self_attn.q_proj [nh*hs, C]  k_proj [nkv*hs, C]  v_proj [nkv*hs, C]
    tinyt  attn.c_attn = rows of q, k, v stacked            [(nh + 2 nkv) * hs, C]
    HF  mlp.gate_proj [I, C]  up_proj [I, C]   ->  tinyt  mlp.c_fc = gate rows, then up
    HF  o_proj, down_proj, input_layernorm, post_attention_layernorm, model.norm, embed_tokens
        ->  tinyt  attn.c_proj, mlp.c_proj, ln_1, ln_2, ln_f, wte

A new family is a new entry here (and, where tinyt's model lacks it, a ModelConfig option):
its keys, spellings, features, weight names, refusals and tokenizer kind. Export-hf writes a
checkpoint as the first entry whose class holds it exactly (`writer_for`).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from tinyt.config import ModelConfig, rope_parameters
from tinyt.errors import ConversionError
from tinyt.hf.family import Family, Head, Spelling, Weight, hf_config, misfit, with_head
from tinyt.hf.tokens import (
    encoder_special_tokens,
    gpt2_special_tokens,
    phi3_special_tokens,
    read_encoder_tokenizer,
    read_gpt2_tokenizer,
    read_tokenizer,
    special_tokens,
)
from tinyt.hf.weights import gate_up_rows, qkv_rows, state_from_hf
from tinyt.tokenizer import Tokenizer


# -- readers: what config.json spells its own way, as ModelConfig settings ---------------------
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


# -- refusals: each returns why tinyt's model cannot run a config.json, or None -------------------
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


def split_biases(hf: dict[str, Any]) -> str | None:
    attn, mlp = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    if attn == mlp:
        return None
    return (f"attention_bias={attn} with mlp_bias={mlp} is not implemented: tinyt's biases are "
            "on every projection or none")


# -- misfits: why a class cannot hold a tinyt model, before the features are compared -----------
def gpt2_misfit(cfg: ModelConfig) -> str | None:
    unmapped = [o for o in cfg.llama_options if not o.startswith("pos_encoding")]
    if unmapped:  # (positions have their own message below)
        return (f"it uses Llama-family options ({', '.join(unmapped)}) that GPT2LMHeadModel "
                "does not have")
    if cfg.pos_encoding != "learned":
        return (f"it has {cfg.pos_encoding} positions: GPT-2 learns its position table "
                "(pos_encoding='learned'), and a computed table written into it would not "
                "come back as the same model")
    return None


def longrope_misfit(cfg: ModelConfig) -> str | None:
    """LongRoPE's switch at the original context is Phi-3's: the other classes switch at
    max_position_embeddings and keep the cache made at the short frequencies."""
    if cfg.rope_scaling is not None and rope_parameters(cfg)[0] == "longrope":
        return "its longrope rotary is Phi3ForCausalLM's"
    return None


def llama_misfit(cfg: ModelConfig) -> str | None:
    if why := longrope_misfit(cfg):
        return why
    if cfg.bias and cfg.qkv_bias is False:
        return ("bias=True with qkv_bias=False (biases everywhere but q, k, v) has no Hugging "
                "Face Llama-family layout")
    if not cfg.bias and cfg.qkv_bias:
        return "biases on q, k, v alone (qkv_bias=True, bias=False) are Qwen2's layout"
    return None


# -- config.json's keys besides the mapped ones ------------------------------------------------
def gpt2_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {"n_ctx": cfg.block_size, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "bos_token_id": eos_id, "pad_token_id": eos_id}  # GPT-2's <|endoftext|> is all three


def _rotary_written(cfg: ModelConfig) -> dict[str, Any]:
    # resolved, not tinyt's None: LlamaConfig's defaults are Llama-7B's
    return {"intermediate_size": cfg.mlp_width, "num_key_value_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim, "rope_scaling": cfg.rope_scaling, "attention_dropout": 0.0,
            "initializer_range": 0.02, "use_cache": True}


def llama_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**_rotary_written(cfg), "pretraining_tp": 1}


def _layer_types(cfg: ModelConfig) -> list[str]:
    return ["sliding_attention" if cfg.windowed(i) else "full_attention"
            for i in range(cfg.n_layer)]


def qwen2_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    local = [i for i in range(cfg.n_layer) if cfg.windowed(i)]
    return {**_rotary_written(cfg), "use_sliding_window": cfg.sliding_window is not None,
            "sliding_window": cfg.sliding_window, "layer_types": _layer_types(cfg),
            "max_window_layers": local[0] if local else cfg.n_layer}


def mistral_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    out = {**_rotary_written(cfg), "sliding_window": cfg.sliding_window}
    if cfg.rope_scaling is None:
        del out["rope_scaling"]  # MistralConfig has no such key
    return out


def smollm3_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**_rotary_written(cfg), "use_sliding_window": cfg.sliding_window is not None,
            "sliding_window": cfg.sliding_window, "layer_types": _layer_types(cfg),
            "no_rope_layers": [int(cfg.rotary_layer(i)) for i in range(cfg.n_layer)],
            "no_rope_layer_interval": 4,
            "pad_token_id": None}  # SmolLM3Config's default is Llama 3's id 128004


def granite_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    scale = cfg.attention_multiplier
    return {**_rotary_written(cfg),  # Granite's attention_multiplier is always explicit
            "attention_multiplier": cfg.head_dim ** -0.5 if scale is None else scale}


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
            "sliding_window": cfg.sliding_window, "layer_types": _layer_types(cfg),
            "final_logit_softcapping": cfg.final_softcap, "initializer_range": 0.02,
            "use_cache": True, "pad_token_id": None}


def gemma3_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**_gemma_written(cfg), "rope_scaling": cfg.rope_scaling,
            "rope_local_base_freq": cfg.rope_local_theta, "attn_logit_softcapping": None,
            "use_bidirectional_attention": False}


def gemma2_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**_gemma_written(cfg), "attn_logit_softcapping": cfg.attn_softcap}


def phi3_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    """Phi3Config's rope_scaling holds exactly type, short_factor and long_factor; the
    original context and max_position_embeddings (original x factor, whatever context tinyt
    kept: transformers' attention factor is read from their ratio) sit beside it."""
    out = {**_rotary_written(cfg), "partial_rotary_factor": cfg.rotary_dims / cfg.head_dim,
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


def mistral_misfit(cfg: ModelConfig) -> str | None:
    if cfg.full_attention_layers:
        return (f"MistralForCausalLM's window covers every layer; this one leaves out "
                f"{list(cfg.full_attention_layers)}")
    return llama_misfit(cfg)




# -- weight names ---------------------------------------------------------------------------------
BLOCK, LAYER = "transformer.h.{i}.", "model.layers.{i}."  # block i in tinyt, in Llama
GPT2_SAME = ("transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.{w}",
             "lm_head.weight", BLOCK + "ln_1.{w}", BLOCK + "ln_2.{w}")
GPT2_CONV1D = (BLOCK + "attn.c_attn.{w}", BLOCK + "attn.c_proj.{w}", BLOCK + "mlp.c_fc.{w}",
               BLOCK + "mlp.c_proj.{w}")
GPT2_WEIGHTS = (*(Weight(name, (name,)) for name in GPT2_SAME),
                *(Weight(name, (name,), conv1d=True) for name in GPT2_CONV1D))
LLAMA_WEIGHTS = (
    Weight("transformer.wte.weight", ("model.embed_tokens.weight",)),
    Weight("transformer.ln_f.weight", ("model.norm.weight",)),
    Weight("lm_head.weight", ("lm_head.weight",)),
    Weight(BLOCK + "ln_1.weight", (LAYER + "input_layernorm.weight",)),
    Weight(BLOCK + "ln_2.weight", (LAYER + "post_attention_layernorm.weight",)),
    Weight(BLOCK + "attn.c_attn.{w}", (LAYER + "self_attn.q_proj.{w}",
                                       LAYER + "self_attn.k_proj.{w}",
                                       LAYER + "self_attn.v_proj.{w}"), rows=qkv_rows),
    Weight(BLOCK + "attn.c_proj.{w}", (LAYER + "self_attn.o_proj.{w}",)),
    Weight(BLOCK + "mlp.c_fc.{w}", (LAYER + "mlp.gate_proj.{w}", LAYER + "mlp.up_proj.{w}"),
           rows=gate_up_rows),
    Weight(BLOCK + "mlp.c_proj.{w}", (LAYER + "mlp.down_proj.{w}",)),
    Weight(BLOCK + "attn.q_norm.weight", (LAYER + "self_attn.q_norm.weight",)),  # Qwen3's
    Weight(BLOCK + "attn.k_norm.weight", (LAYER + "self_attn.k_norm.weight",)),
)

GEMMA_WEIGHTS = (
    Weight("transformer.wte.weight", ("model.embed_tokens.weight",)),
    Weight("transformer.ln_f.weight", ("model.norm.weight",)),
    Weight("lm_head.weight", ("lm_head.weight",)),
    Weight(BLOCK + "ln_1.weight", (LAYER + "input_layernorm.weight",)),
    Weight(BLOCK + "ln_1_out.weight", (LAYER + "post_attention_layernorm.weight",)),
    Weight(BLOCK + "ln_2.weight", (LAYER + "pre_feedforward_layernorm.weight",)),
    Weight(BLOCK + "ln_2_out.weight", (LAYER + "post_feedforward_layernorm.weight",)),
    *(w for w in LLAMA_WEIGHTS if "c_" in w.ours or "_norm" in w.ours),  # q, k, v, o; MLP
)

PHI3_WEIGHTS = (  # q, k, v and gate, up fused as tinyt fuses them, in the same row order
    *(w for w in LLAMA_WEIGHTS if "c_attn" not in w.ours and "c_fc" not in w.ours
      and "_norm" not in w.ours),
    Weight(BLOCK + "attn.c_attn.weight", (LAYER + "self_attn.qkv_proj.weight",)),
    Weight(BLOCK + "mlp.c_fc.weight", (LAYER + "mlp.gate_up_proj.weight",)),
)

# -- the entries ---------------------------------------------------------------------------------
GPT2 = Family(
    model_type="gpt2", architecture="GPT2LMHeadModel",
    keys={"n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd",
          "n_positions": "block_size", "vocab_size": "vocab_size",
          "layer_norm_epsilon": "norm_eps", "n_inner": "n_inner",
          "tie_word_embeddings": "tie_weights"},
    defaults={"n_inner": None, "tie_word_embeddings": True},  # n_inner None = 4 * n_embd in both
    spelled={"activation_function": Spelling("activation", {
        "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_fast": "gelu_tanh"}, default="gelu_new")},
    features={"norm": "layernorm", "pos_encoding": "learned"},
    fixed={"scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
           "add_cross_attention": False, "scale_attn_weights": True},
    misfit=gpt2_misfit,
    weights=GPT2_WEIGHTS, base="transformer.",
    buffers=(".attn.bias", ".attn.masked_bias"),  # causal-mask buffers of older saves
    zero_biases=True,
    read_tokenizer=read_gpt2_tokenizer, special_tokens=gpt2_special_tokens,
    written=gpt2_written,
)
_ROTARY_KEYS = {"hidden_size": "n_embd", "intermediate_size": "n_inner",
                "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                "num_key_value_heads": "n_kv_head", "max_position_embeddings": "block_size",
                "vocab_size": "vocab_size", "rms_norm_eps": "norm_eps", "rope_theta": "rope_theta",
                "tie_word_embeddings": "tie_weights"}
_ROTARY_DEFAULTS = {"num_key_value_heads": None, "max_position_embeddings": 2048,
                    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}
_SILU = {"hidden_act": Spelling("activation", {"silu": "swiglu"}, default="silu",
                                why=" (its gated MLP is SwiGLU)")}
_ROTARY = {"norm": "rmsnorm", "pos_encoding": "rotary"}
_BIASES = {"attention_bias": "bias", "mlp_bias": "bias"}  # Llama's: all or none (split_biases)
_NO_BIASES = {"attention_bias": False, "mlp_bias": False}
_LLAMA_LIKE = dict(spelled=_SILU, weights=LLAMA_WEIGHTS, base="model.",
                   buffers=("rotary_emb.inv_freq",), read_tokenizer=read_tokenizer,
                   special_tokens=special_tokens)
LLAMA = Family(
    model_type="llama", architecture="LlamaForCausalLM",
    keys={**_ROTARY_KEYS, **_BIASES}, defaults={**_ROTARY_DEFAULTS, **_NO_BIASES},
    features=_ROTARY, refuses=(sliding_window, split_biases), misfit=llama_misfit,
    reads=(read_rope_scaling, head_dim_reader(None)),
    holds=frozenset({"rope_scaling", "head_size"}), written=llama_written, **_LLAMA_LIKE,
)
_QWEN_WINDOW = window_reader("use_sliding_window", qwen_windowed)
QWEN2 = Family(
    model_type="qwen2", architecture="Qwen2ForCausalLM",
    keys=_ROTARY_KEYS, defaults={**_ROTARY_DEFAULTS, "max_position_embeddings": 32768},
    features={**_ROTARY, "bias": False, "qkv_bias": True},
    refuses=(uneven_heads,), reads=(read_rope_scaling, _QWEN_WINDOW), misfit=longrope_misfit,
    holds=frozenset({"rope_scaling", "sliding_window", "full_attention_layers"}),
    written=qwen2_written, **_LLAMA_LIKE,
)
QWEN3 = Family(  # Qwen2 with q/k norms, head_dim of its own and no q, k, v biases
    model_type="qwen3", architecture="Qwen3ForCausalLM",
    keys=_ROTARY_KEYS, defaults={**_ROTARY_DEFAULTS, "max_position_embeddings": 32768},
    features={**_ROTARY, "bias": False, "qk_norm": True},
    fixed={"attention_bias": False}, misfit=longrope_misfit,
    reads=(read_rope_scaling, head_dim_reader(128), _QWEN_WINDOW),
    holds=frozenset({"rope_scaling", "head_size", "sliding_window", "full_attention_layers"}),
    written=qwen2_written, **_LLAMA_LIKE,
)
MISTRAL = Family(  # Llama with a sliding window over every layer
    model_type="mistral", architecture="MistralForCausalLM",
    keys=_ROTARY_KEYS, defaults={**_ROTARY_DEFAULTS, "max_position_embeddings": 4096 * 32},
    features={**_ROTARY, "bias": False},
    reads=(read_rope_scaling, head_dim_reader(None),
           window_reader(None, lambda hf, i: True, default=4096)),  # MistralConfig's window
    holds=frozenset({"rope_scaling", "head_size", "sliding_window"}), misfit=mistral_misfit,
    written=mistral_written, **_LLAMA_LIKE,
)
SMOLLM3 = Family(  # Llama with layers that have no rotary positions
    model_type="smollm3", architecture="SmolLM3ForCausalLM",
    keys={**_ROTARY_KEYS, **_BIASES},
    defaults={**_ROTARY_DEFAULTS, **_NO_BIASES, "max_position_embeddings": 32768,
              "rope_theta": 2000000.0, "tie_word_embeddings": True},  # PretrainedConfig's tie
    features=_ROTARY, refuses=(split_biases,), misfit=llama_misfit,  # windows by layer_types
    reads=(read_rope_scaling, head_dim_reader(None), read_nope_layers,
           window_reader("use_sliding_window",  # its window is on the layers without rotary
                         lambda hf, i: i in read_nope_layers(hf)["nope_layers"])),
    holds=frozenset({"rope_scaling", "head_size", "nope_layers", "sliding_window",
                     "full_attention_layers"}),
    written=smollm3_written, **_LLAMA_LIKE,
)
GRANITE = Family(  # Llama with four multipliers
    model_type="granite", architecture="GraniteForCausalLM",
    keys={**_ROTARY_KEYS, **_BIASES, "embedding_multiplier": "embedding_multiplier",
          "residual_multiplier": "residual_multiplier",
          "attention_multiplier": "attention_multiplier", "logits_scaling": "logits_scaling"},
    defaults={**_ROTARY_DEFAULTS, **_NO_BIASES, "embedding_multiplier": 1.0,
              "residual_multiplier": 1.0, "attention_multiplier": 1.0, "logits_scaling": 1.0},
    features=_ROTARY, refuses=(split_biases,), misfit=llama_misfit,
    reads=(read_rope_scaling, head_dim_reader(None)),
    holds=frozenset({"rope_scaling", "head_size", "embedding_multiplier", "residual_multiplier",
                     "attention_multiplier", "logits_scaling"}),
    written=granite_written, **_LLAMA_LIKE,
)
_GEMMA_FEATURES = {**_ROTARY, "bias": False, "norm_offset": 1.0, "post_norms": True}
_GEMMA_HOLDS = {"head_size", "embedding_multiplier", "attention_multiplier", "final_softcap",
                "sliding_window", "full_attention_layers"}
_GEGLU = {"hidden_activation": Spelling("activation", {"gelu_pytorch_tanh": "geglu_tanh"},
                                        default="gelu_pytorch_tanh",
                                        why=" (its gated MLP is GeGLU with tanh GELU)")}
GEMMA3 = Family(  # Gemma 3 text (270M, 1B): four norms a block of gain 1 + w, q/k norms,
    # windowed layers at a rotary base of their own
    model_type="gemma3_text", architecture="Gemma3ForCausalLM",
    keys=_ROTARY_KEYS,
    defaults={**_ROTARY_DEFAULTS, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
              "tie_word_embeddings": True},
    spelled=_GEGLU, features={**_GEMMA_FEATURES, "qk_norm": True},
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
    keys=_ROTARY_KEYS,
    defaults={**_ROTARY_DEFAULTS, "max_position_embeddings": 8192,
              "tie_word_embeddings": True},
    spelled=_GEGLU, features=_GEMMA_FEATURES,
    fixed={"attention_bias": False}, refuses=(gemma_rope_scaling,),
    reads=(head_dim_reader(256), read_gemma, gemma_layer_types(2), read_gemma2),
    holds=frozenset(_GEMMA_HOLDS | {"attn_softcap"}), misfit=gemma_misfit,
    weights=GEMMA_WEIGHTS, base="model.", buffers=("rotary_emb.inv_freq",),
    read_tokenizer=read_tokenizer, special_tokens=special_tokens, written=gemma2_written,
)
PHI3 = Family(  # Phi-3 / 3.5 / Phi-4-mini: fused projections, LongRoPE, partial rotary
    model_type="phi3", architecture="Phi3ForCausalLM",
    keys=_ROTARY_KEYS,
    defaults={**_ROTARY_DEFAULTS, "max_position_embeddings": PHI3_ORIGINAL,
              "rms_norm_eps": 1e-5},
    features={**_ROTARY, "bias": False},
    reads=(read_longrope, head_dim_reader(None), read_partial_rotary,
           window_reader(None, lambda hf, i: True)),  # its window covers every layer
    holds=frozenset({"rope_scaling", "head_size", "sliding_window", "rotary_dim"}),
    misfit=phi3_misfit, written=phi3_written,
    **{**_LLAMA_LIKE, "weights": PHI3_WEIGHTS, "special_tokens": phi3_special_tokens},
)
def bert_weights(prefix: str) -> tuple[Weight, ...]:
    """BertModel's tensors (RoBERTa's and XLM-R's the same under their prefix)."""
    emb, layer = prefix + "embeddings.", prefix + "encoder.layer.{i}."
    return (
        Weight("transformer.wte.weight", (emb + "word_embeddings.weight",)),
        Weight("transformer.wpe.weight", (emb + "position_embeddings.weight",)),
        Weight("transformer.wtt.weight", (emb + "token_type_embeddings.weight",)),
        Weight("transformer.ln_e.{w}", (emb + "LayerNorm.{w}",)),
        Weight(BLOCK + "attn.c_attn.{w}", (layer + "attention.self.query.{w}",
                                           layer + "attention.self.key.{w}",
                                           layer + "attention.self.value.{w}"), rows=qkv_rows),
        Weight(BLOCK + "attn.c_proj.{w}", (layer + "attention.output.dense.{w}",)),
        Weight(BLOCK + "ln_1.{w}", (layer + "attention.output.LayerNorm.{w}",)),
        Weight(BLOCK + "mlp.c_fc.{w}", (layer + "intermediate.dense.{w}",)),
        Weight(BLOCK + "mlp.c_proj.{w}", (layer + "output.dense.{w}",)),
        Weight(BLOCK + "ln_2.{w}", (layer + "output.LayerNorm.{w}",)),
    )


DISTIL = "distilbert.embeddings.", "distilbert.transformer.layer.{i}."
DISTILBERT_WEIGHTS = (
    Weight("transformer.wte.weight", (DISTIL[0] + "word_embeddings.weight",)),
    Weight("transformer.wpe.weight", (DISTIL[0] + "position_embeddings.weight",)),
    Weight("transformer.ln_e.{w}", (DISTIL[0] + "LayerNorm.{w}",)),
    Weight(BLOCK + "attn.c_attn.{w}", (DISTIL[1] + "attention.q_lin.{w}",
                                       DISTIL[1] + "attention.k_lin.{w}",
                                       DISTIL[1] + "attention.v_lin.{w}"), rows=qkv_rows),
    Weight(BLOCK + "attn.c_proj.{w}", (DISTIL[1] + "attention.out_lin.{w}",)),
    Weight(BLOCK + "ln_1.{w}", (DISTIL[1] + "sa_layer_norm.{w}",)),
    Weight(BLOCK + "mlp.c_fc.{w}", (DISTIL[1] + "ffn.lin1.{w}",)),
    Weight(BLOCK + "mlp.c_proj.{w}", (DISTIL[1] + "ffn.lin2.{w}",)),
    Weight(BLOCK + "ln_2.{w}", (DISTIL[1] + "output_layer_norm.{w}",)),
)


def read_roberta_positions(hf: dict[str, Any]) -> dict[str, Any]:
    """RoBERTa numbers a row's real tokens from pad_token_id + 1 (rows 0..pad of its table
    are never read by them): tinyt's context is the table less those rows."""
    pad = hf.get("pad_token_id", 1)
    if not (isinstance(pad, int) and pad >= 0):
        raise ConversionError(f"pad_token_id={pad!r} must be an integer >= 0")
    offset, table = pad + 1, hf.get("max_position_embeddings", 514)
    if not (isinstance(table, int) and table > offset + 1):
        raise ConversionError(f"max_position_embeddings={table!r} leaves no position after "
                              f"the {offset} rows RoBERTa's positions start from")
    return {"block_size": table - offset, "position_offset": offset}


def roberta_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {"max_position_embeddings": cfg.block_size + cfg.position_offset,
            "pad_token_id": cfg.position_offset - 1, **bert_written(cfg, eos_id)}


def bert_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


_BERT_KEYS = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
              "num_attention_heads": "n_head", "intermediate_size": "n_inner",
              "max_position_embeddings": "block_size", "vocab_size": "vocab_size",
              "layer_norm_eps": "norm_eps", "type_vocab_size": "type_vocab_size"}
_GELU = {"hidden_act": Spelling("activation", {
    "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}, default="gelu")}
_ENCODER = {"task": "encoder", "norm": "layernorm", "pos_encoding": "learned",
            "norm_placement": "post", "embedding_norm": True, "bias": True,
            "tie_weights": False}
def no_pooling(hf: dict[str, Any]) -> dict[str, Any]:
    """A bare base model gives hidden states only: how its tokens make a sentence is a
    sentence-transformers directory's Pooling (read over this), or a head's."""
    return {"pooling": None}


_SEQUENCE = {"task": "classifier", "pooling": "cls"}  # every one of these pools [CLS] / <s>
_TOKENS = {"task": "token_classifier", "pooling": None}
_TOKEN_HEAD = (Weight("classifier.{w}", ("classifier.{w}",)),)


def bert_heads(name: str, prefix: str) -> tuple[Head, ...]:
    """BERT's and RoBERTa's sequence and token classifiers: the sequence head a dense + tanh
    on [CLS] (BERT's pooler; RoBERTa's classifier.dense) then the label projection."""
    pooler, out = (("classifier.dense.{w}", "classifier.out_proj.{w}") if name != "Bert" else
                   (prefix + "pooler.dense.{w}", "classifier.{w}"))
    return (Head(f"{name}ForSequenceClassification", "classifier",
                 {**_SEQUENCE, "pooler_activation": "tanh"},
                 (Weight("pooler.{w}", (pooler,)), Weight("classifier.{w}", (out,))),
                 keeps_pooler=name == "Bert"),  # RoBERTa's head is its own: a saved base
                 #                                pooler is dropped, as transformers does
            Head(f"{name}ForTokenClassification", "token_classifier", _TOKENS, _TOKEN_HEAD))


_BERT_LIKE = dict(
    spelled=_GELU, features=_ENCODER,
    fixed={"position_embedding_type": "absolute", "is_decoder": False,
           "add_cross_attention": False},
    holds=frozenset({"type_vocab_size", "normalize", "position_offset"}),
    buffers=("embeddings.position_ids", "embeddings.token_type_ids"),
    # the base model's pooler (tanh of [CLS]'s dense): no sentence embedding of sentence-
    # transformers' uses it, nor tinyt's contract; dropped by name, and said
    drops=("pooler.dense.weight", "pooler.dense.bias"),
    read_tokenizer=read_encoder_tokenizer, special_tokens=encoder_special_tokens,
    task="encoder",
)
BERT = Family(  # BertModel: the encoder of all-MiniLM, bge, e5 and sentence-transformers' kin
    model_type="bert", architecture="BertModel", keys=_BERT_KEYS,
    defaults={"layer_norm_eps": 1e-12, "type_vocab_size": 2},
    weights=bert_weights("bert."), base="bert.", written=bert_written,
    heads=bert_heads("Bert", "bert."), reads=(no_pooling,),
    misfit=lambda cfg: ("BertModel's positions start at row 0" if cfg.position_offset else
                        "BertModel has a token-type table" if not cfg.type_vocab_size
                        else None),
    **_BERT_LIKE,
)
def roberta_misfit(arch: str) -> Callable[[ModelConfig], str | None]:
    return lambda cfg: None if cfg.position_offset else \
        f"{arch}'s positions start after its padding row (position_offset >= 1)"


ROBERTA = Family(  # RobertaModel: BERT's layout, positions from pad_token_id + 1
    model_type="roberta", architecture="RobertaModel", keys=_BERT_KEYS,
    defaults={"layer_norm_eps": 1e-12, "type_vocab_size": 1},
    reads=(read_roberta_positions, no_pooling), weights=bert_weights("roberta."),
    base="roberta.", written=roberta_written, heads=bert_heads("Roberta", "roberta."),
    misfit=roberta_misfit("RobertaModel"), **_BERT_LIKE,
)
# XLMRobertaModel: RoBERTa under another name (multilingual MiniLM, e5)
XLM_ROBERTA = dataclasses.replace(
    ROBERTA, model_type="xlm-roberta", architecture="XLMRobertaModel",
    heads=bert_heads("XLMRoberta", "roberta."), misfit=roberta_misfit("XLMRobertaModel"))

DISTILBERT = Family(  # DistilBertModel: no token types, eps fixed at 1e-12, q/k/v_lin
    model_type="distilbert", architecture="DistilBertModel",
    keys={"dim": "n_embd", "n_layers": "n_layer", "n_heads": "n_head",
          "hidden_dim": "n_inner", "max_position_embeddings": "block_size",
          "vocab_size": "vocab_size"},
    defaults={"max_position_embeddings": 512},
    spelled={"activation": Spelling("activation", {"gelu": "gelu"}, default="gelu",
                                    why=" (its MLP's GELU; ReLU is not one of tinyt's)")},
    features={**_ENCODER, "norm_eps": 1e-12}, reads=(no_pooling,),
    holds=frozenset({"normalize"}),
    weights=DISTILBERT_WEIGHTS, base="distilbert.",
    heads=(Head("DistilBertForSequenceClassification", "classifier",
                {**_SEQUENCE, "pooler_activation": "relu"},
                (Weight("pooler.{w}", ("pre_classifier.{w}",)),
                 Weight("classifier.{w}", ("classifier.{w}",))),
                outside=("classifier.", "pre_classifier.")),
           Head("DistilBertForTokenClassification", "token_classifier", _TOKENS, _TOKEN_HEAD)),
    buffers=("embeddings.position_ids",),
    read_tokenizer=read_encoder_tokenizer, special_tokens=encoder_special_tokens,
    written=lambda cfg, eos: {"dropout": 0.0, "attention_dropout": 0.0,
                              "sinusoidal_pos_embds": False},
    misfit=lambda cfg: ("DistilBertModel has no token-type table" if cfg.type_vocab_size
                        else "DistilBertModel's positions start at row 0"
                        if cfg.position_offset else None),
    task="encoder",
)

MB = "model.layers.{i}."
MODERNBERT_WEIGHTS = (
    Weight("transformer.wte.weight", ("model.embeddings.tok_embeddings.weight",)),
    Weight("transformer.ln_e.{w}", ("model.embeddings.norm.{w}",)),
    Weight(BLOCK + "ln_1.{w}", (MB + "attn_norm.{w}",)),  # none in layer 0
    Weight(BLOCK + "attn.c_attn.{w}", (MB + "attn.Wqkv.{w}",)),  # rows q | k | v, as tinyt's
    Weight(BLOCK + "attn.c_proj.{w}", (MB + "attn.Wo.{w}",)),
    Weight(BLOCK + "ln_2.{w}", (MB + "mlp_norm.{w}",)),
    Weight(BLOCK + "mlp.c_fc.{w}", (MB + "mlp.Wi.{w}",)),  # the activated half first, as tinyt's
    Weight(BLOCK + "mlp.c_proj.{w}", (MB + "mlp.Wo.{w}",)),
    Weight("transformer.ln_f.{w}", ("model.final_norm.{w}",)),
)


def read_modernbert(hf: dict[str, Any]) -> dict[str, Any]:
    """One bias setting for every projection and norm (tinyt's `bias`); the global layers,
    every `global_attn_every_n_layers`-th from layer 0; the rest see `local_attention` // 2
    tokens either side."""
    biases = {k: hf.get(k, False) for k in ("attention_bias", "mlp_bias", "norm_bias")}
    if len(set(biases.values())) != 1:
        raise ConversionError(f"{biases}: tinyt's model has biases everywhere or nowhere")
    every = hf.get("global_attn_every_n_layers", 3)
    layers = hf.get("num_hidden_layers")
    if not (isinstance(every, int) and every >= 1 and isinstance(layers, int)):
        raise ConversionError(f"global_attn_every_n_layers={every!r} must be an integer >= 1")
    out = {"bias": biases["norm_bias"],
           "full_attention_layers": tuple(i for i in range(layers) if i % every == 0)}
    params = hf.get("rope_parameters")  # transformers 5: each layer type's base in here
    if isinstance(params, dict):
        for kind, field in (("full_attention", "rope_theta"),
                            ("sliding_attention", "rope_local_theta")):
            theta = params.get(kind, {}).get("rope_theta") \
                if isinstance(params.get(kind), dict) else None
            if theta is not None:
                out[field] = float(theta)
    return out


def read_modernbert_head(hf: dict[str, Any]) -> dict[str, Any]:
    """The head: classifier_pooling, classifier_activation, and its dense layer's bias, which
    tinyt's pooler shares with the model's."""
    pooling = hf.get("classifier_pooling", "cls")
    act = hf.get("classifier_activation", "gelu")
    if pooling not in ("cls", "mean"):
        raise ConversionError(f"classifier_pooling={pooling!r}: tinyt pools cls or mean")
    if act not in ("gelu", "tanh", "relu"):
        raise ConversionError(f"classifier_activation={act!r} is not implemented by tinyt's "
                              "head; allowed: gelu, tanh, relu")
    if hf.get("classifier_bias", False) != hf.get("norm_bias", False):
        raise ConversionError(f"classifier_bias={hf.get('classifier_bias')!r} with "
                              f"norm_bias={hf.get('norm_bias')!r}: tinyt's head has the "
                              "model's bias setting")
    return {"pooling": pooling, "pooler_activation": act}


def modernbert_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    every = cfg.full_attention_layers[1] if len(cfg.full_attention_layers) > 1 else cfg.n_layer
    head = {"classifier_pooling": cfg.pooling or "cls",
            "classifier_activation": cfg.pooler_activation, "classifier_bias": cfg.bias} \
        if cfg.pooler_activation else {}
    return {"attention_bias": cfg.bias, "mlp_bias": cfg.bias, "norm_bias": cfg.bias,
            "global_attn_every_n_layers": every, "embedding_dropout": 0.0,
            "attention_dropout": 0.0, "mlp_dropout": 0.0, **head}


def modernbert_rope(hf: dict[str, Any]) -> str | None:
    """ModernBERT's rotary is the default one; a scaling (rope_scaling, or a type in
    transformers 5's rope_parameters) would turn it otherwise: refused, not ignored."""
    scaling = hf.get("rope_scaling")
    params = hf.get("rope_parameters")
    kinds = [scaling.get("rope_type", scaling.get("type"))] if isinstance(scaling, dict) else \
        [scaling] if scaling is not None else []
    if isinstance(params, dict):
        kinds += [p.get("rope_type") for p in params.values() if isinstance(p, dict)]
        kinds.append(params.get("rope_type"))
    odd = [k for k in kinds if k not in (None, "default")]
    return f"rope scaling {odd[0]!r} is not implemented for ModernBertModel by tinyt" \
        if odd else None


def modernbert_misfit(cfg: ModelConfig) -> str | None:
    layers = cfg.full_attention_layers
    every = layers[1] if len(layers) > 1 else cfg.n_layer
    if layers != tuple(range(0, cfg.n_layer, every)):
        return f"ModernBertModel's global layers are every n-th from 0; these are {layers}"
    return None


_MB_HEAD = (Weight("pooler.{w}", ("head.dense.{w}",)),
            Weight("pooler_norm.{w}", ("head.norm.{w}",)),
            Weight("classifier.{w}", ("classifier.{w}",)))
MODERNBERT = Family(  # ModernBertModel: rotary, GeGLU, local / global layers, pre-norm
    model_type="modernbert", architecture="ModernBertModel",
    keys={"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
          "num_attention_heads": "n_head", "intermediate_size": "n_inner",
          "max_position_embeddings": "block_size", "vocab_size": "vocab_size",
          "norm_eps": "norm_eps", "global_rope_theta": "rope_theta",
          "local_rope_theta": "rope_local_theta", "local_attention": "sliding_window"},
    defaults={"norm_eps": 1e-5, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0,
              "local_attention": 128, "max_position_embeddings": 8192},
    spelled={"hidden_activation": Spelling("activation", {"gelu": "geglu"}, default="gelu",
                                           why=" (its MLP is GeGLU with the exact GELU)")},
    features={"task": "encoder", "norm": "layernorm", "pos_encoding": "rotary",
              "norm_placement": "pre", "embedding_norm": True, "first_block_norm": False,
              "tie_weights": False},
    reads=(read_modernbert, no_pooling), refuses=(modernbert_rope,),
    holds=frozenset({"sliding_window", "full_attention_layers", "rope_local_theta",
                     "normalize", "pooler_norm", "pooler_activation", "first_block_norm",
                     "embedding_norm", "norm_placement"}),
    misfit=modernbert_misfit,
    weights=MODERNBERT_WEIGHTS, base="model.",
    read_tokenizer=read_encoder_tokenizer, special_tokens=encoder_special_tokens,
    written=modernbert_written, task="encoder",
    heads=(Head("ModernBertForSequenceClassification", "classifier",
                {"task": "classifier", "pooler_norm": True}, _MB_HEAD,
                outside=("head.", "classifier."), reads=(read_modernbert_head,)),
           Head("ModernBertForTokenClassification", "token_classifier",
                {"task": "token_classifier", "pooling": None, "pooler_norm": True}, _MB_HEAD,
                outside=("head.", "classifier."),
                reads=(lambda hf: {"pooler_activation": read_modernbert_head(
                    {**hf, "classifier_pooling": "cls"})["pooler_activation"]},))),
)

# export-hf takes the first that holds a model: the plainer classes first
CATALOGUE = (GPT2, LLAMA, QWEN2, MISTRAL, QWEN3, SMOLLM3, GRANITE, GEMMA3, GEMMA2, PHI3, BERT,
             DISTILBERT, ROBERTA, XLM_ROBERTA, MODERNBERT)
TASKS = {"causal_lm": "causal LMs", "classifier": "classifiers", "encoder": "encoders",
         "token_classifier": "token classifiers"}  # a task's name in messages
# what export-hf and an artifact's config.json may be written as: the entries and their heads
WRITERS = CATALOGUE + tuple(with_head(f, h) for f in CATALOGUE for h in f.heads)


def family_of(hf: dict[str, Any], source: str) -> Family:
    """The entry of a config.json's model_type; others are refused, naming what tinyt reads."""
    for family in CATALOGUE:
        if hf.get("model_type") == family.model_type:
            return family
    known = ", ".join(f"{f.model_type!r} ({f.architecture})" for f in CATALOGUE)
    raise ConversionError(f"{source}: model_type {hf.get('model_type')!r} is not one tinyt "
                          f"imports: {known}")


def writer_for(cfg: ModelConfig, source: str,
               among: tuple[Family, ...] = WRITERS) -> Family:
    """The first entry whose class holds cfg exactly; otherwise refused with each one's reason."""
    of_task = [f for f in among if f.task == cfg.task]
    names = " / ".join(f.architecture for f in (of_task or among))
    if not of_task:
        tasks = " / ".join(dict.fromkeys(TASKS.get(f.task, f.task) for f in among))
        raise ConversionError(f"{source} is a {cfg.task}: only {tasks} map onto {names}")
    reasons: list[str] = []
    for family in of_task:
        why = misfit(family, cfg)
        if why is None:
            return family
        if why not in reasons:
            reasons.append(why)
    raise ConversionError(f"{source} cannot be written as {names}: {'; '.join(reasons)}")


def gpt2_config(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    """config.json of the GPT2LMHeadModel holding cfg (as the ONNX artifact's config.json)."""
    return hf_config(GPT2, cfg, eos_id)


def llama_config(cfg: ModelConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    """config.json of the LlamaForCausalLM / Qwen2ForCausalLM holding cfg; a model neither
    holds exactly is refused by name (ConversionError)."""
    family = writer_for(cfg, "the model", among=CATALOGUE[1:])
    return hf_config(family, cfg, tokenizer.eos_id, tokenizer.bos_id)


def encoder_config(cfg: ModelConfig, architecture: str | None = None) -> dict[str, Any]:
    """config.json of the encoder class holding cfg, as an encoder artifact's config.json:
    `architecture` (the class it was imported from) where that holds it, else the first that
    does (XLM-R and RoBERTa hold the same models); none: refused by name (ConversionError)."""
    first = tuple(f for f in WRITERS if f.architecture == architecture)
    return hf_config(writer_for(cfg, "the model", among=first + WRITERS), cfg, None)


def state_from_llama(tensors: dict[str, torch.Tensor], cfg: ModelConfig,
                     source: str) -> dict[str, torch.Tensor]:
    """HF Llama / Qwen2 tensors under tinyt's names (q, k, v and gate, up stacked): the two
    share their names, and cfg says which biases there are."""
    return state_from_hf(LLAMA, tensors, cfg, source)
