"""Hugging Face GPT-2 directories in and out: `tinyt import-hf` and `tinyt export-hf` (torch).

    HF dir (config.json, model.safetensors | shards, tokenizer.json | vocab.json + merges.txt)
        ──import_hf──▶ tinyt checkpoint ──to_hf_gpt2──▶ HF dir (logits checked)

GPT-2 is tinyt's architecture (learned positions, pre-norm blocks, fused QKV, GELU MLP, tied
lm_head) in another layout; the tables below are the whole difference:
- names: tinyt's are GPT2LMHeadModel's; a GPT2Model save has no `transformer.` prefix, and
  older saves carry the causal-mask buffers `attn.bias` / `attn.masked_bias` (not weights);
- HF GPT-2's projections are `Conv1D`, weight [in, out]: c_attn, c_proj and c_fc transposed;
- `activation_function`: "gelu" is the exact erf GELU, "gelu_new" (GPT-2's default),
  "gelu_pytorch_tanh" and "gelu_fast" its tanh approximation (tinyt `gelu_tanh`).
Options tinyt's model does not implement are refused by name, never approximated. The
exported directory is what `transformers`, CTranslate2's `TransformersConverter` and
llama.cpp's converter read; its logits are checked against tinyt's (HF_LOGITS_ATOL) before it
is written, and a `tinyt` block in its config.json lets an import restore what GPT-2's layout
spells differently (a bias-free model's zero biases).
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tinyt.checkpoint import (
    check_import_target,
    check_tokenizer_fits,
    load_checkpoint,
    load_weights,
    read_safetensors,
    save_import,
)
from tinyt.config import ModelConfig
from tinyt.errors import CheckpointError, ConfigError, ConversionError
from tinyt.fsutil import atomic_dir, write_json
from tinyt.model import build_model
from tinyt.tokenizer import EOS_TOKEN, Tokenizer

HF_LOGITS_ATOL = 1e-5  # tinyt vs transformers on the same weights, logits max abs diff
TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of older saves
PREFIX = "transformer."

# HF GPT2Config key -> ModelConfig field (n_inner None = 4 * n_embd in both).
CONFIG_MAP = {"n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd",
              "n_positions": "block_size", "vocab_size": "vocab_size",
              "layer_norm_epsilon": "norm_eps", "n_inner": "n_inner"}
ACTIVATIONS_IN = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh"}
ACTIVATIONS_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
# Options of GPT2Config that change the function, with the only value tinyt implements.
REQUIRED = {"scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "add_cross_attention": False, "scale_attn_weights": True}
SAFETENSORS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"


# -- out: tinyt -> Hugging Face -----------------------------------------------------------------
def gpt2_config(cfg: ModelConfig, eos_id: int | None) -> dict:
    return {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "n_embd": cfg.n_embd, "n_head": cfg.n_head, "n_layer": cfg.n_layer,
        "n_inner": cfg.n_inner, "vocab_size": cfg.vocab_size,
        "n_positions": cfg.block_size, "n_ctx": cfg.block_size,
        "activation_function": ACTIVATIONS_OUT[cfg.activation],
        "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": True, "tie_word_embeddings": cfg.tie_weights,
        "bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id,
        "torch_dtype": "float32",
    }


def gpt2_state_dict(model, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """tinyt's weights under GPT-2's names and layouts (a bias-free model gets zero biases)."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_weights:
            continue  # tied: GPT2LMHeadModel takes it from wte
        if name.endswith(TRANSPOSED):
            tensor = tensor.t()  # Linear [out, in] -> Conv1D [in, out]
        out[name] = tensor.detach().contiguous().clone()
    for i in range(cfg.n_layer):
        p = f"{PREFIX}h.{i}."
        shapes = {"ln_1.bias": cfg.n_embd, "ln_2.bias": cfg.n_embd,
                  "attn.c_attn.bias": 3 * cfg.n_embd, "attn.c_proj.bias": cfg.n_embd,
                  "mlp.c_fc.bias": cfg.mlp_width, "mlp.c_proj.bias": cfg.n_embd}
        for k, n in shapes.items():
            out.setdefault(p + k, torch.zeros(n))
    out.setdefault(f"{PREFIX}ln_f.bias", torch.zeros(cfg.n_embd))
    return out


def to_hf(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """`tinyt export-hf`: a Llama-family checkpoint as LlamaForCausalLM / Qwen2ForCausalLM
    (tinyt.hfllama), any other causal LM as GPT2LMHeadModel."""
    cfg = load_checkpoint(checkpoint_dir).config
    if cfg.llama_options:
        from tinyt.hfllama import to_hf_llama

        return to_hf_llama(checkpoint_dir, out_dir)
    return to_hf_gpt2(checkpoint_dir, out_dir)


def to_hf_gpt2(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a tinyt causal-LM checkpoint as a Hugging Face GPT-2 directory; returns out_dir."""
    from transformers import GPT2Config, GPT2LMHeadModel

    ckpt = load_checkpoint(checkpoint_dir)
    cfg = ckpt.config
    if cfg.task != "causal_lm":
        raise ConversionError(f"{checkpoint_dir} is a {cfg.task}: only causal LMs map onto "
                              "GPT2LMHeadModel")
    unmapped = [o for o in cfg.llama_options if not o.startswith("pos_encoding")]
    if unmapped:  # (positions have their own message below)
        raise ConversionError(f"{checkpoint_dir} uses Llama-family options "
                              f"({', '.join(unmapped)}) that GPT2LMHeadModel does not have")
    if cfg.pos_encoding != "learned":
        raise ConversionError(f"{checkpoint_dir} has {cfg.pos_encoding} positions: GPT-2 learns "
                              "its position table (pos_encoding='learned'), and a computed table "
                              "written into it would not come back as the same model")
    eos = ckpt.tokenizer.eos_id
    hf = GPT2LMHeadModel(GPT2Config(**gpt2_config(cfg, eos))).eval()
    missing, unexpected = hf.load_state_dict(gpt2_state_dict(ckpt.model, cfg), strict=False)
    missing = [k for k in missing if not k.endswith(MASK_BUFFERS)
               and not (k == "lm_head.weight" and cfg.tie_weights)]
    if missing or unexpected:
        raise ConversionError(f"weights did not map: missing {missing}, unexpected {unexpected}")
    if cfg.tie_weights:
        hf.tie_weights()
    worst = _logits_diff(ckpt.model, hf, cfg)
    with atomic_dir(out_dir) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        ckpt.tokenizer.save(tmp / "tokenizer.json")
        special = {"eos_token": EOS_TOKEN, "bos_token": EOS_TOKEN,
                   "unk_token": EOS_TOKEN} if eos is not None else {}
        write_json(tmp / "tokenizer_config.json", {
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.block_size,
            **special})
        meta = json.loads((tmp / "config.json").read_text())
        meta["tinyt"] = {"source": str(Path(checkpoint_dir).resolve()), "bias": cfg.bias,
                         "logits_max_abs_diff": worst}
        write_json(tmp / "config.json", meta)
    return Path(out_dir)


def _logits_diff(model, hf, cfg: ModelConfig) -> float:
    """Max abs logits difference on two random prompts of block_size tokens; refused above
    HF_LOGITS_ATOL."""
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.block_size),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        worst = float((model.eval()(ids)[0] - hf(ids).logits).abs().max())
    if not worst <= HF_LOGITS_ATOL:
        raise ConversionError(f"the GPT-2 model's logits differ from tinyt's by {worst:.3g} "
                              f"(allowed {HF_LOGITS_ATOL})")
    return worst


# -- in: Hugging Face -> tinyt ------------------------------------------------------------------
def config_from_hf(hf: dict[str, Any], source: str) -> ModelConfig:
    """ModelConfig of a GPT2LMHeadModel config.json; what tinyt cannot run is refused by name."""
    if hf.get("model_type") != "gpt2":
        raise ConversionError(f"{source}: model_type {hf.get('model_type')!r} is not one "
                              "tinyt imports: 'gpt2' (GPT2LMHeadModel), 'llama' "
                              "(LlamaForCausalLM), 'qwen2' (Qwen2ForCausalLM)")
    archs = hf.get("architectures") or ["GPT2LMHeadModel"]
    if archs != ["GPT2LMHeadModel"]:
        raise ConversionError(f"{source}: architectures {archs}; tinyt imports GPT2LMHeadModel "
                              "(a language-model head on GPT-2)")
    for key, value in REQUIRED.items():
        if hf.get(key, value) != value:
            raise ConversionError(f"{source}: {key}={hf[key]!r} is not implemented by tinyt's "
                                  f"model (it runs {key}={value!r}); refusing rather than "
                                  "approximating it")
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS_IN:
        raise ConversionError(f"{source}: activation_function={act!r} is not implemented by "
                              f"tinyt's model; allowed: {', '.join(ACTIVATIONS_IN)}")
    missing = [k for k in CONFIG_MAP if k not in hf and k != "n_inner"]
    if missing:
        raise ConversionError(f"{source} lacks {missing}: not a complete GPT-2 config")
    tinyt_block = hf.get("tinyt") if isinstance(hf.get("tinyt"), dict) else {}
    try:
        return ModelConfig(**{field: hf.get(key) for key, field in CONFIG_MAP.items()},
                           activation=ACTIVATIONS_IN[act], pos_encoding="learned",
                           tie_weights=bool(hf.get("tie_word_embeddings", True)),
                           bias=bool(tinyt_block.get("bias", True)), dropout=0.0)
    except ConfigError as e:
        raise ConversionError(f"{source}: {e}") from None


def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards its index names; pickles refused."""
    if (directory / SAFETENSORS).is_file():
        return read_safetensors(directory / SAFETENSORS)
    if (directory / SHARD_INDEX).is_file():
        try:
            weight_map = json.loads((directory / SHARD_INDEX).read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{directory / SHARD_INDEX} is not a shard index: {e}") \
                from None
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            if Path(shard).name != shard:
                raise CheckpointError(f"{directory / SHARD_INDEX} names shard {shard!r} outside "
                                      "the directory")
            tensors.update(read_safetensors(directory / shard))
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise CheckpointError(f"{directory / SHARD_INDEX} lists {absent[:5]} but no shard "
                                  "holds them")
        return tensors
    pickles = sorted(p.name for p in directory.glob("pytorch_model*.bin"))
    if pickles:
        raise CheckpointError(
            f"{directory} holds {pickles[0]}, a pickle, and no {SAFETENSORS}: tinyt does not "
            "unpickle model files. Convert it where you trust it: python -c \"from "
            "transformers import GPT2LMHeadModel as M; "
            f"M.from_pretrained('{directory}').save_pretrained('{directory}', "
            "safe_serialization=True)\"")
    raise CheckpointError(f"{directory} has no {SAFETENSORS} nor {SHARD_INDEX}")


def state_from_hf(tensors: dict[str, torch.Tensor], cfg: ModelConfig,
                  source: str) -> dict[str, torch.Tensor]:
    """HF GPT-2 tensors under tinyt's names and layouts."""
    state = {}
    for key, value in tensors.items():
        if key.endswith(MASK_BUFFERS):
            continue
        if key != "lm_head.weight" and not key.startswith(PREFIX):
            key = PREFIX + key  # a GPT2Model save
        if key.endswith(TRANSPOSED):
            value = value.t()  # Conv1D [in, out] -> Linear [out, in]
        state[key] = value.contiguous()
    head = state.get("lm_head.weight")
    if cfg.tie_weights and head is not None:
        if not torch.equal(head, state.get(f"{PREFIX}wte.weight", head)):
            raise CheckpointError(f"{source}: tie_word_embeddings is true but lm_head.weight "
                                  "differs from transformer.wte.weight")
        del state["lm_head.weight"]
    if not cfg.bias:  # written by export-hf from a bias-free model: its biases are zeros
        for key in [k for k in state if k.endswith(".bias")]:
            if bool(state[key].any()):
                raise CheckpointError(f"{source}: config.json says the model is bias-free but "
                                      f"{key} is not zero")
            del state[key]
    return state


def read_hf_tokenizer(directory: Path) -> Tokenizer:
    """tokenizer.json, or GPT-2's vocab.json + merges.txt as a byte-level BPE."""
    if (directory / "tokenizer.json").is_file():
        return Tokenizer.from_file(directory / "tokenizer.json")
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise CheckpointError(f"{directory} has no tokenizer.json nor vocab.json + merges.txt")
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    try:
        hf = HFTokenizer(models.BPE.from_file(str(vocab), str(merges)))
        known = json.loads(vocab.read_text(encoding="utf-8"))
    except Exception as e:  # the Rust parser raises a bare Exception
        raise CheckpointError(f"{vocab} / {merges} are not a BPE vocabulary: {e}") from None
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    if EOS_TOKEN in known:
        hf.add_special_tokens([EOS_TOKEN])
    return Tokenizer(hf)


def import_hf(directory: str | os.PathLike, out: str | os.PathLike, *,
              log: Callable[[str], None] = lambda s: None) -> Path:
    """Write a tinyt checkpoint from a local Hugging Face directory: GPT2LMHeadModel here,
    LlamaForCausalLM and Qwen2ForCausalLM in tinyt.hfllama."""
    directory, out = Path(directory), Path(out)
    if not directory.is_dir():
        raise CheckpointError(f"Hugging Face model directory {directory} does not exist")
    check_import_target(out)
    try:
        hf_cfg = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{directory / 'config.json'} is not readable JSON: {e}") from None
    if hf_cfg.get("model_type") in ("llama", "qwen2"):
        from tinyt.hfllama import import_llama

        return import_llama(directory, out, hf_cfg, log=log)
    cfg = config_from_hf(hf_cfg, str(directory / "config.json"))
    tok = read_hf_tokenizer(directory)
    check_tokenizer_fits(tok, cfg, "the tokenizer")
    eos = hf_cfg.get("eos_token_id")
    if eos is not None and eos != tok.eos_id:
        raise ConversionError(f"config.json's eos_token_id={eos} is not the tokenizer's "
                              f"{EOS_TOKEN} ({tok.eos_id}); tinyt ends text at {EOS_TOKEN}")
    model = build_model(cfg)
    source = f"Hugging Face model {directory}"
    load_weights(model, state_from_hf(read_hf_weights(directory), cfg, source), source)
    return save_import(out, model, tok, {
        "imported_from": "huggingface", "source_dir": str(directory.resolve()),
        "parameters": model.num_parameters()}, log)
