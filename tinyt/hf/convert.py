"""Hugging Face directories in and out, for every catalogue entry (torch; transformers to write).

    HF dir (config.json, model.safetensors | shards, tokenizer files)
        ──import_hf──▶ tinyt checkpoint ──to_hf──▶ HF dir (logits checked)

In: the entry of config.json's model_type reads the config, the tokenizer and the weights;
`tinyt.checkpoint.save_import` writes the checkpoint (every importer's tail). Out: the first
entry whose class holds the model exactly is built by transformers from the entry's
config.json, given the weights under its names, and compared with tinyt's logits
(HF_LOGITS_ATOL) before anything is written. The written config.json carries a `tinyt` block
with what an import restores that the layout spells otherwise (a bias-free GPT-2's zero
biases, the tokenizer's settings).
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tinyt.checkpoint import (
    Checkpoint,
    check_import_target,
    check_tokenizer_fits,
    load_checkpoint,
    save_import,
)
from tinyt.config import ModelConfig
from tinyt.errors import CheckpointError, ConversionError
from tinyt.fsutil import atomic_dir, read_json_object, write_json
from tinyt.hf.catalogue import GPT2, family_of, writer_for
from tinyt.hf.family import Family, config_from_hf, for_class, hf_config, labels_of
from tinyt.hf.sentence import read_sentence_modules
from tinyt.hf.weights import hf_state, read_hf_weights, state_from_hf

# tinyt vs transformers on the same weights, logits max abs diff. The same fp32 arithmetic in
# other orders (tinyt runs q, k, v and gate, up as one matmul each): ~sqrt(K)·u of the terms'
# size per reordered sum, compounding over the layers (measured 1.16e-5 at the Llama-3.2-1B
# shape, 16 layers, K up to 8,192; below 1e-6 on the test models); a wrong conversion (a
# rotary half, a head order, a norm) moves logits by ~0.1. The bound of export's verify.
HF_LOGITS_ATOL = 1e-4
CHECK_TOKENS = 64  # prompt length of the logits check, unless positions are a learned table


# -- in: Hugging Face -> tinyt ------------------------------------------------------------------
def import_hf(directory: str | os.PathLike, out: str | os.PathLike, *,
              context: int | None = None, log: Callable[[str], None] = lambda s: None) -> Path:
    """Write a tinyt checkpoint from a local Hugging Face directory of a catalogue family
    (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM); returns out.

    context: keep a shorter context than the model's max_position_embeddings (block_size = N,
    2 <= N <= the model's). Exact for the positions kept: computed rotary positions do not
    depend on it (refused where a rope scaling would), and a learned table (GPT-2) keeps its
    first N rows. The checkpoint's metrics record {"context": N, "model_context": the model's}."""
    directory, out = Path(directory), Path(out)
    if not directory.is_dir():
        raise CheckpointError(f"Hugging Face model directory {directory} does not exist")
    check_import_target(out)
    sentence = read_sentence_modules(directory)
    root = directory if sentence is None else sentence.transformer
    hf_cfg = read_json_object(root / "config.json", CheckpointError)
    family = for_class(family_of(hf_cfg, str(root / "config.json")), hf_cfg,
                       str(root / "config.json"))
    cfg = config_from_hf(family, hf_cfg, str(root / "config.json"))
    labels = labels_of(hf_cfg) if cfg.task in ("classifier", "token_classifier") else None
    if sentence is not None:
        if cfg.task != "encoder":
            raise ConversionError(f"{directory}: a sentence-transformers directory around a "
                                  f"{family.architecture}; tinyt reads encoders there")
        cfg = dataclasses.replace(cfg, pooling=sentence.pooling, normalize=sentence.normalize)
        log(f"sentence-transformers: {sentence.pooling} pooling"
            + (", normalized" if sentence.normalize else ""))
    model_context = cfg.block_size
    tok = family.read_tokenizer(root, hf_cfg, log)
    check_tokenizer_fits(tok, cfg, "the tokenizer")
    if cfg.task != "causal_lm":  # texts cut as the model was run: its own length, else its context
        cut = min(sentence.max_seq_length or cfg.block_size, cfg.block_size) \
            if sentence is not None else cfg.block_size
        tok.hf.enable_truncation(cut)
        tok.hf.no_padding()
    source = f"Hugging Face model {directory}"
    tensors = read_hf_weights(root)
    dropped = sorted(k for k in tensors if k.endswith(family.drops))
    if dropped:
        log(f"not imported (tinyt's {family.architecture} has no use for them): {dropped}")
    state = state_from_hf(family, tensors, cfg, source)
    kept = {}
    if context is not None:
        cfg, state = _shorter_context(cfg, state, context, str(directory / "config.json"))
        kept = {"context": cfg.block_size, "model_context": model_context}
        log(f"context: {cfg.block_size} of the model's {model_context} tokens")
    return save_import(out, cfg, tok, state, source=source, log=log, labels=labels, metrics={
        "imported_from": "huggingface", "architecture": family.architecture,
        "source_dir": str(directory.resolve()), **kept})


def _shorter_context(cfg: ModelConfig, state: dict[str, torch.Tensor], context: int,
                     source: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The config and weights of the model at `context` tokens (import-hf --context)."""
    if not (isinstance(context, int) and not isinstance(context, bool)
            and 2 <= context <= cfg.block_size):
        raise ConversionError(f"--context {context!r}: the context kept must be an integer from "
                              f"2 (a token and one to follow) to the model's "
                              f"max_position_embeddings, {cfg.block_size} ({source})")
    short = dataclasses.replace(cfg, block_size=context)
    if cfg.pos_encoding == "rotary":
        _same_rotary(cfg, short, source)
    if cfg.pos_encoding == "learned":  # the first N rows: positions 0..N-1, as they were
        rows = context + cfg.position_offset  # (RoBERTa's: after its offset rows)
        state = {k: (v[:rows].clone() if k.endswith("wpe.weight") else v)
                 for k, v in state.items()}
    return short, state


def _same_rotary(cfg: ModelConfig, short: ModelConfig, source: str) -> None:
    """Refuse a shorter context where the rotary frequencies depend on it (a rope scaling
    read against max_position_embeddings): the positions kept would change."""
    from tinyt.rope import rope_frequencies

    (a, fa), (b, fb) = rope_frequencies(cfg), rope_frequencies(short)
    if not (np.array_equal(a, b) and fa == fb):
        raise ConversionError(f"{source}: this model's rope scaling is computed from its "
                              f"context ({cfg.block_size}), so --context {short.block_size} "
                              "would change every position's rotation; import it whole")


# -- out: tinyt -> Hugging Face -----------------------------------------------------------------
def to_hf(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """`tinyt export-hf`: a causal-LM checkpoint as the first catalogue class that holds it
    exactly (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, ...:
    tinyt.hf.catalogue.CATALOGUE's order); returns out_dir."""
    ckpt = load_checkpoint(checkpoint_dir)
    return _write_hf(writer_for(ckpt.config, str(checkpoint_dir)), ckpt, checkpoint_dir, out_dir)


def to_hf_gpt2(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a tinyt causal-LM checkpoint as a Hugging Face GPT-2 directory; returns out_dir."""
    ckpt = load_checkpoint(checkpoint_dir)
    family = writer_for(ckpt.config, str(checkpoint_dir), among=(GPT2,))
    return _write_hf(family, ckpt, checkpoint_dir, out_dir)


def _write_hf(family: Family, ckpt: Checkpoint, checkpoint_dir: str | os.PathLike,
              out_dir: str | os.PathLike) -> Path:
    """The export tail: transformers' model of the entry with tinyt's weights, its logits
    checked, then saved with the tokenizer files."""
    import transformers

    cfg, tok = ckpt.config, ckpt.tokenizer
    settings = {k: v for k, v in hf_config(family, cfg, tok.eos_id, tok.bos_id).items()
                if k not in ("model_type", "architectures")}
    hf_class = getattr(transformers, family.architecture)
    if cfg.attn_softcap is not None:  # transformers' SDPA path leaves Gemma 2's cap out
        settings["attn_implementation"] = "eager"
    hf = hf_class(transformers.AutoConfig.for_model(family.model_type, **settings)).eval()
    missing, unexpected = hf.load_state_dict(hf_state(family, ckpt.model), strict=False)
    missing = [k for k in missing if not k.endswith(family.buffers)
               and not (k == "lm_head.weight" and cfg.tie_weights)]
    if missing or unexpected:
        raise ConversionError(f"weights did not map: missing {missing}, unexpected {unexpected}")
    if cfg.tie_weights:
        hf.tie_weights()
    worst = _logits_diff(ckpt.model, hf, family, cfg)
    with atomic_dir(out_dir) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        tok.save(tmp / "tokenizer.json")
        write_json(tmp / "tokenizer_config.json", {
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.block_size,
            **family.special_tokens(tok)})
        meta = json.loads((tmp / "config.json").read_text())
        meta["tinyt"] = {"source": str(Path(checkpoint_dir).resolve()),
                         "logits_max_abs_diff": worst,
                         "bias": cfg.bias, "tokenizer": tok.settings}  # what import restores
        write_json(tmp / "config.json", meta)
    return Path(out_dir)


def _logits_diff(model, hf, family: Family, cfg: ModelConfig) -> float:
    """Max abs logits difference on two random prompts; refused above HF_LOGITS_ATOL. A learned
    position table is checked row by row (the whole block); computed positions need no more
    than CHECK_TOKENS."""
    T = cfg.block_size if cfg.pos_encoding == "learned" else min(cfg.block_size, CHECK_TOKENS)
    ids = torch.randint(0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        worst = float((model.eval()(ids)[0] - hf(ids).logits).abs().max())
    if not worst <= HF_LOGITS_ATOL:
        raise ConversionError(f"the {family.architecture}'s logits differ from tinyt's by "
                              f"{worst:.3g} (allowed {HF_LOGITS_ATOL})")
    return worst
