"""The Hugging Face architectures tinyt reads and writes: one `Family` entry each.

    entry     model_type  class              tinyt features
    GPT2      gpt2        GPT2LMHeadModel    learned positions, LayerNorm, GELU, fused Conv1D
    LLAMA     llama       LlamaForCausalLM   RMSNorm, rotary, SwiGLU, n_kv_head, biases: all|none
    QWEN2     qwen2       Qwen2ForCausalLM   as Llama, biases on q, k, v only

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

from typing import Any

import torch

from tinyt.config import ModelConfig
from tinyt.errors import ConversionError
from tinyt.hf.family import Family, Spelling, Weight, hf_config, misfit
from tinyt.hf.tokens import (
    gpt2_special_tokens,
    read_gpt2_tokenizer,
    read_tokenizer,
    special_tokens,
)
from tinyt.hf.weights import gate_up_rows, qkv_rows, state_from_hf
from tinyt.tokenizer import Tokenizer


# -- refusals: each returns why tinyt's model cannot run a config.json, or None -------------------
def rope_scaling(hf: dict[str, Any]) -> str | None:
    scaling = hf.get("rope_scaling") or {}
    kind = scaling.get("rope_type") or scaling.get("type") if isinstance(scaling, dict) \
        else scaling
    if kind in (None, "default"):
        return None
    return (f"rope scaling {kind!r} is not implemented by tinyt's rotary positions (plain "
            "RoPE, rope_type 'default'); refusing rather than approximating it")


def _window(hf: dict[str, Any]) -> str:
    return (f"sliding-window attention (sliding_window={hf.get('sliding_window')}) is not "
            "implemented by tinyt's attention, which sees the whole context")


def sliding_window(hf: dict[str, Any]) -> str | None:
    """Llama's: a window size, or the switch, turns it on."""
    return _window(hf) if hf.get("use_sliding_window") or hf.get("sliding_window") else None


def sliding_window_switch(hf: dict[str, Any]) -> str | None:
    """Qwen2's: `use_sliding_window` alone turns it on (its sliding_window is then unused)."""
    return _window(hf) if hf.get("use_sliding_window") else None


def uneven_heads(hf: dict[str, Any]) -> str | None:
    heads, width, head_dim = hf["num_attention_heads"], hf["hidden_size"], hf.get("head_dim")
    if head_dim is None or not isinstance(heads, int) or head_dim * heads == width:
        return None
    return (f"head_dim={head_dim} with {heads} heads is not hidden_size={width}: tinyt's "
            "heads split the width evenly")


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


def llama_misfit(cfg: ModelConfig) -> str | None:
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
            "head_dim": cfg.head_dim, "rope_scaling": None, "attention_dropout": 0.0,
            "initializer_range": 0.02, "use_cache": True}


def llama_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**_rotary_written(cfg), "pretraining_tp": 1}


def qwen2_written(cfg: ModelConfig, eos_id: int | None) -> dict[str, Any]:
    return {**_rotary_written(cfg), "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": cfg.n_layer}


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
LLAMA = Family(
    model_type="llama", architecture="LlamaForCausalLM",
    keys={**_ROTARY_KEYS, "attention_bias": "bias", "mlp_bias": "bias"},
    defaults={**_ROTARY_DEFAULTS, "attention_bias": False, "mlp_bias": False},
    spelled=_SILU, features=_ROTARY,
    refuses=(rope_scaling, sliding_window, uneven_heads, split_biases), misfit=llama_misfit,
    weights=LLAMA_WEIGHTS, base="model.", buffers=("rotary_emb.inv_freq",),
    read_tokenizer=read_tokenizer, special_tokens=special_tokens, written=llama_written,
)
QWEN2 = Family(
    model_type="qwen2", architecture="Qwen2ForCausalLM",
    keys=_ROTARY_KEYS, defaults=_ROTARY_DEFAULTS, spelled=_SILU,
    features={**_ROTARY, "bias": False, "qkv_bias": True},
    refuses=(rope_scaling, sliding_window_switch, uneven_heads),
    weights=LLAMA_WEIGHTS, base="model.", buffers=("rotary_emb.inv_freq",),
    read_tokenizer=read_tokenizer, special_tokens=special_tokens, written=qwen2_written,
)
CATALOGUE = (GPT2, LLAMA, QWEN2)  # export-hf takes the first that holds a model
TASKS = {"causal_lm": "causal LMs", "classifier": "classifiers"}  # a task's name in messages


def family_of(hf: dict[str, Any], source: str) -> Family:
    """The entry of a config.json's model_type; others are refused, naming what tinyt reads."""
    for family in CATALOGUE:
        if hf.get("model_type") == family.model_type:
            return family
    known = ", ".join(f"{f.model_type!r} ({f.architecture})" for f in CATALOGUE)
    raise ConversionError(f"{source}: model_type {hf.get('model_type')!r} is not one tinyt "
                          f"imports: {known}")


def writer_for(cfg: ModelConfig, source: str,
               among: tuple[Family, ...] = CATALOGUE) -> Family:
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
    family = writer_for(cfg, "the model", among=(LLAMA, QWEN2))
    return hf_config(family, cfg, tokenizer.eos_id, tokenizer.bos_id)


def state_from_llama(tensors: dict[str, torch.Tensor], cfg: ModelConfig,
                     source: str) -> dict[str, torch.Tensor]:
    """HF Llama / Qwen2 tensors under tinyt's names (q, k, v and gate, up stacked): the two
    share their names, and cfg says which biases there are."""
    return state_from_hf(LLAMA, tensors, cfg, source)
