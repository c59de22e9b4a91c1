"""Hugging Face Llama-family directories in and out: LlamaForCausalLM (SmolLM2, TinyLlama,
Llama-3.2 layouts) and Qwen2ForCausalLM, through `tinyt import-hf` / `tinyt export-hf` (torch).

    HF dir (config.json, model.safetensors | shards, tokenizer.json, tokenizer_config.json)
        ──import_llama──▶ tinyt checkpoint ──to_hf_llama──▶ HF dir (logits checked)

The model is tinyt's own with its Llama options (norm='rmsnorm', pos_encoding='rotary',
activation='swiglu', n_kv_head); the layouts differ only in how projections are split:

    HF  self_attn.q_proj [nh*hs, C]  k_proj [nkv*hs, C]  v_proj [nkv*hs, C]
    tinyt  attn.c_attn = rows of q, k, v stacked            [(nh + 2 nkv) * hs, C]
    HF  mlp.gate_proj [I, C]  up_proj [I, C]   ->  tinyt  mlp.c_fc = gate rows, then up
    HF  o_proj, down_proj, input_layernorm, post_attention_layernorm, model.norm, embed_tokens
        ->  tinyt  attn.c_proj, mlp.c_proj, ln_1, ln_2, ln_f, wte

Biases: Llama has none (or, with attention_bias and mlp_bias, every projection's: tinyt
bias=True); Qwen2 has q/k/v's only (tinyt bias=False, qkv_bias=True). What tinyt's model does
not implement (rope scaling, a sliding window, another activation, a head_dim that is not
hidden_size / heads, attention biases without MLP biases) is refused by name, never
approximated. The tokenizer's end, begin and chat template travel in tokenizer_config.json.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tinyt.checkpoint import check_tokenizer_fits, load_checkpoint, load_weights, save_import
from tinyt.config import ModelConfig
from tinyt.errors import CheckpointError, ConfigError
from tinyt.fsutil import atomic_dir, write_json
from tinyt.hfgpt2 import HF_LOGITS_ATOL, ConversionError, read_hf_weights
from tinyt.model import build_model
from tinyt.tokenizer import Tokenizer, read_settings

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
SKIPPED = ("rotary_emb.inv_freq",)  # a buffer older saves wrote; computed, not a weight


def _rope_theta(hf: dict[str, Any], source: str) -> float:
    """rope_theta from transformers 4.x's keys or 5.x's rope_parameters; scaling refused."""
    params = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    scaling = hf.get("rope_scaling") or {}
    kind = params.get("rope_type") or (scaling.get("rope_type") or scaling.get("type")
                                       if isinstance(scaling, dict) else scaling)
    if kind not in (None, "default"):
        raise ConversionError(f"{source}: rope scaling {kind!r} is not implemented by tinyt's "
                              "rotary positions (plain RoPE, rope_type 'default'); refusing "
                              "rather than approximating it")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def config_from_llama(hf: dict[str, Any], source: str) -> ModelConfig:
    """ModelConfig of a LlamaForCausalLM / Qwen2ForCausalLM config.json."""
    family = hf.get("model_type")
    archs = hf.get("architectures") or [ARCHITECTURES[family]]
    if archs != [ARCHITECTURES[family]]:
        raise ConversionError(f"{source}: architectures {archs}; tinyt imports "
                              f"{ARCHITECTURES[family]} for model_type {family!r}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError(f"{source}: hidden_act={act!r} is not implemented: tinyt's gated "
                              "MLP is SwiGLU (hidden_act 'silu')")
    if hf.get("use_sliding_window") or (family != "qwen2" and hf.get("sliding_window")):
        raise ConversionError(f"{source}: sliding-window attention (sliding_window="
                              f"{hf.get('sliding_window')}) is not implemented by tinyt's "
                              "attention, which sees the whole context")
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "vocab_size") if k not in hf]
    if missing:
        raise ConversionError(f"{source} lacks {missing}: not a complete {family} config")
    heads, width = hf["num_attention_heads"], hf["hidden_size"]
    head_dim = hf.get("head_dim")
    if head_dim is not None and isinstance(heads, int) and head_dim * heads != width:
        raise ConversionError(f"{source}: head_dim={head_dim} with {heads} heads is not "
                              f"hidden_size={width}: tinyt's heads split the width evenly")
    if family == "qwen2":
        bias, qkv_bias = False, True
    else:
        attn, mlp = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
        if attn != mlp:
            raise ConversionError(f"{source}: attention_bias={attn} with mlp_bias={mlp} is not "
                                  "implemented: tinyt's biases are on every projection or none")
        bias, qkv_bias = attn, None
    try:
        return ModelConfig(
            block_size=hf.get("max_position_embeddings", 2048), vocab_size=hf["vocab_size"],
            n_layer=hf["num_hidden_layers"], n_head=heads, n_embd=width,
            n_inner=hf["intermediate_size"],
            n_kv_head=hf.get("num_key_value_heads") or heads,
            norm="rmsnorm", norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            pos_encoding="rotary", rope_theta=_rope_theta(hf, source), activation="swiglu",
            bias=bias, qkv_bias=qkv_bias, tie_weights=bool(hf.get("tie_word_embeddings", False)),
            dropout=0.0)
    except ConfigError as e:
        raise ConversionError(f"{source}: {e}") from None


def state_from_llama(tensors: dict[str, torch.Tensor], cfg: ModelConfig,
                     source: str) -> dict[str, torch.Tensor]:
    """HF Llama / Qwen2 tensors under tinyt's names (q, k, v and gate, up stacked)."""
    sd = {k.removeprefix("model."): v for k, v in tensors.items() if not k.endswith(SKIPPED)}
    out, used = {}, set()

    def take(key: str) -> torch.Tensor:
        if key not in sd:
            raise CheckpointError(f"{source} lacks {key!r}")
        used.add(key)
        return sd[key]

    out["transformer.wte.weight"] = take("embed_tokens.weight")
    out["transformer.ln_f.weight"] = take("norm.weight")
    for i in range(cfg.n_layer):
        p, q = f"layers.{i}.", f"transformer.h.{i}."
        out[f"{q}ln_1.weight"] = take(f"{p}input_layernorm.weight")
        out[f"{q}ln_2.weight"] = take(f"{p}post_attention_layernorm.weight")
        out[f"{q}attn.c_attn.weight"] = torch.cat([take(f"{p}self_attn.{x}_proj.weight")
                                                   for x in "qkv"])
        out[f"{q}attn.c_proj.weight"] = take(f"{p}self_attn.o_proj.weight")
        out[f"{q}mlp.c_fc.weight"] = torch.cat([take(f"{p}mlp.gate_proj.weight"),
                                                take(f"{p}mlp.up_proj.weight")])
        out[f"{q}mlp.c_proj.weight"] = take(f"{p}mlp.down_proj.weight")
        if cfg.bias or cfg.qkv_bias:
            out[f"{q}attn.c_attn.bias"] = torch.cat([take(f"{p}self_attn.{x}_proj.bias")
                                                     for x in "qkv"])
        if cfg.bias:
            out[f"{q}attn.c_proj.bias"] = take(f"{p}self_attn.o_proj.bias")
            out[f"{q}mlp.c_fc.bias"] = torch.cat([take(f"{p}mlp.gate_proj.bias"),
                                                  take(f"{p}mlp.up_proj.bias")])
            out[f"{q}mlp.c_proj.bias"] = take(f"{p}mlp.down_proj.bias")
    head = sd.get("lm_head.weight")
    if head is not None:
        used.add("lm_head.weight")
        if not cfg.tie_weights:
            out["lm_head.weight"] = head
        elif not torch.equal(head, out["transformer.wte.weight"]):
            raise CheckpointError(f"{source}: tie_word_embeddings is true but lm_head.weight "
                                  "differs from model.embed_tokens.weight")
    unexpected = sorted(set(sd) - used)
    if unexpected:  # a weight tinyt would drop is a model tinyt does not implement
        raise CheckpointError(f"{source} holds weights tinyt's model has no place for: "
                              f"{unexpected[:8]}")
    return {k: v.contiguous() for k, v in out.items()}


def _token(tok, idx) -> str | None:
    return tok.id_to_token(idx) if isinstance(idx, int) else None


def read_llama_tokenizer(directory: Path, hf_cfg: dict[str, Any],
                         log: Callable[[str], None]) -> Tokenizer:
    """tokenizer.json with its tokenizer_config.json; the end-of-text token is the one the
    model's generation_config.json (else config.json) declares, as transformers' generate
    stops at it."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        model = " (only a SentencePiece tokenizer.model)" if \
            (directory / "tokenizer.model").is_file() else ""
        raise CheckpointError(
            f"{directory} has no tokenizer.json{model}; write one where transformers is "
            "installed: python -c \"from transformers import AutoTokenizer as T; "
            f"T.from_pretrained('{directory}').save_pretrained('{directory}')\"")
    base = Tokenizer.from_file(path)
    own = hf_cfg.get("tinyt", {}).get("tokenizer") if isinstance(hf_cfg.get("tinyt"), dict) \
        else None
    if isinstance(own, dict):  # written by export-hf: tinyt's own settings, exactly
        return Tokenizer(base.hf, **own)
    settings = read_settings(directory)
    gen = {}
    if (directory / "generation_config.json").is_file():
        gen = json.loads((directory / "generation_config.json").read_text(encoding="utf-8"))
    declared = gen.get("eos_token_id", hf_cfg.get("eos_token_id"))
    ids = declared if isinstance(declared, list) else [declared] if declared is not None else []
    named = settings.get("eos_token")
    if ids:  # the tokenizer's own eos if the model declares it, else the model's first
        chosen = named if named is not None and base.hf.token_to_id(named) in ids else \
            _token(base.hf, ids[0])
        if chosen is None:
            raise ConversionError(f"{directory}: eos_token_id {ids[0]} is not in the tokenizer")
        if len(ids) > 1:
            log(f"the model declares {len(ids)} end-of-text ids {ids}; tinyt stops at one, "
                f"{chosen!r} ({base.hf.token_to_id(chosen)})")
        settings["eos_token"] = chosen
    if "bos_token" not in settings and _token(base.hf, hf_cfg.get("bos_token_id")):
        settings["bos_token"] = _token(base.hf, hf_cfg.get("bos_token_id"))
    return Tokenizer(base.hf, **settings)


def import_llama(directory: Path, out: Path, hf_cfg: dict[str, Any], *,
                 log: Callable[[str], None]) -> Path:
    """The Llama-family branch of import_hf: config, tokenizer, weights, checkpoint."""
    cfg = config_from_llama(hf_cfg, str(directory / "config.json"))
    tok = read_llama_tokenizer(directory, hf_cfg, log)
    check_tokenizer_fits(tok, cfg, "the tokenizer")
    model = build_model(cfg)
    source = f"Hugging Face model {directory}"
    load_weights(model, state_from_llama(read_hf_weights(directory), cfg, source), source)
    return save_import(out, model, tok, {
        "imported_from": "huggingface", "architecture": ARCHITECTURES[hf_cfg["model_type"]],
        "source_dir": str(directory.resolve()), "parameters": model.num_parameters()}, log)


# -- out: tinyt -> Hugging Face -----------------------------------------------------------------
def llama_family(cfg: ModelConfig) -> str:
    """'llama' or 'qwen2': the HF class a config maps onto exactly; otherwise refused by name."""
    form = {"norm": (cfg.norm, "rmsnorm"), "pos_encoding": (cfg.pos_encoding, "rotary"),
            "activation": (cfg.activation, "swiglu")}
    off = [f"{k}={have!r}" for k, (have, want) in form.items() if have != want]
    if off:
        raise ConversionError(f"a Llama-family model has norm='rmsnorm', pos_encoding='rotary' "
                              f"and activation='swiglu'; this one has {', '.join(off)}")
    if not cfg.bias and cfg.qkv_bias:
        return "qwen2"
    if cfg.bias and cfg.qkv_bias is False:
        raise ConversionError("bias=True with qkv_bias=False (biases everywhere but q, k, v) "
                              "has no Hugging Face Llama-family layout")
    return "llama"


def llama_config(cfg: ModelConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    """config.json of the LlamaForCausalLM / Qwen2ForCausalLM holding a tinyt model."""
    family = llama_family(cfg)
    out = {"model_type": family, "architectures": [ARCHITECTURES[family]],
           "hidden_size": cfg.n_embd, "intermediate_size": cfg.mlp_width,
           "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
           "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
           "max_position_embeddings": cfg.block_size, "vocab_size": cfg.vocab_size,
           "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta, "rope_scaling": None,
           "hidden_act": "silu", "tie_word_embeddings": cfg.tie_weights,
           "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
           # no BOS of its own (tinyt's tokenizers): the end-of-text token, as GPT-2's
           "bos_token_id": tokenizer.eos_id if tokenizer.bos_id is None else tokenizer.bos_id,
           "eos_token_id": tokenizer.eos_id,
           "torch_dtype": "float32"}
    if family == "llama":
        out |= {"attention_bias": cfg.bias, "mlp_bias": cfg.bias, "pretraining_tp": 1}
    else:
        out |= {"use_sliding_window": False, "sliding_window": None,
                "max_window_layers": cfg.n_layer}
    return out


def llama_state_dict(model, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """tinyt's weights under HF Llama / Qwen2 names (c_attn and c_fc split back)."""
    sd = model.state_dict()
    C, kv = cfg.n_embd, cfg.kv_heads * cfg.head_dim
    out = {"model.embed_tokens.weight": sd["transformer.wte.weight"],
           "model.norm.weight": sd["transformer.ln_f.weight"]}
    if not cfg.tie_weights:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.n_layer):
        p, q = f"model.layers.{i}.", f"transformer.h.{i}."
        out[f"{p}input_layernorm.weight"] = sd[f"{q}ln_1.weight"]
        out[f"{p}post_attention_layernorm.weight"] = sd[f"{q}ln_2.weight"]
        for suffix in ("weight", "bias"):
            if f"{q}attn.c_attn.{suffix}" in sd:
                for x, t in zip("qkv", sd[f"{q}attn.c_attn.{suffix}"].split([C, kv, kv])):
                    out[f"{p}self_attn.{x}_proj.{suffix}"] = t
            if f"{q}attn.c_proj.{suffix}" in sd:
                out[f"{p}self_attn.o_proj.{suffix}"] = sd[f"{q}attn.c_proj.{suffix}"]
            if f"{q}mlp.c_fc.{suffix}" in sd:
                gate, up = sd[f"{q}mlp.c_fc.{suffix}"].chunk(2)
                out[f"{p}mlp.gate_proj.{suffix}"], out[f"{p}mlp.up_proj.{suffix}"] = gate, up
                out[f"{p}mlp.down_proj.{suffix}"] = sd[f"{q}mlp.c_proj.{suffix}"]
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def to_hf_llama(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a tinyt Llama-family checkpoint as a Hugging Face LlamaForCausalLM /
    Qwen2ForCausalLM directory, its logits checked against tinyt's first; returns out_dir."""
    import transformers

    ckpt = load_checkpoint(checkpoint_dir)
    cfg, tok = ckpt.config, ckpt.tokenizer
    hf_cfg = llama_config(cfg, tok)
    family = hf_cfg["model_type"]
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}
    model_class = getattr(transformers, ARCHITECTURES[family])
    hf = model_class(config_class[family](**{k: v for k, v in hf_cfg.items()
                                             if k not in ("model_type", "architectures")}))
    missing, unexpected = hf.load_state_dict(llama_state_dict(ckpt.model, cfg), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.tie_weights)]
    if missing or unexpected:
        raise ConversionError(f"weights did not map: missing {missing}, unexpected {unexpected}")
    if cfg.tie_weights:
        hf.tie_weights()
    ids = torch.randint(0, cfg.vocab_size, (2, min(cfg.block_size, 64)),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        worst = float((ckpt.model.eval()(ids)[0] - hf.eval()(ids).logits).abs().max())
    if not worst <= HF_LOGITS_ATOL:
        raise ConversionError(f"the {ARCHITECTURES[family]}'s logits differ from tinyt's by "
                              f"{worst:.3g} (allowed {HF_LOGITS_ATOL})")
    with atomic_dir(out_dir) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        tok.save(tmp / "tokenizer.json")
        write_json(tmp / "tokenizer_config.json", {
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.block_size,
            **tok.settings, "eos_token": tok.eos_token, "pad_token": tok.eos_token,
            "bos_token": tok.bos_token or tok.eos_token})  # CTranslate2 needs one
        meta = json.loads((tmp / "config.json").read_text())
        meta["tinyt"] = {"source": str(Path(checkpoint_dir).resolve()),
                         "logits_max_abs_diff": worst,
                         "tokenizer": tok.settings}  # what import restores exactly
        write_json(tmp / "config.json", meta)
    return Path(out_dir)
