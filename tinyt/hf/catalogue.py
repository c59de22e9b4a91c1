"""The Hugging Face architectures tinyt reads and writes, assembled from one file a family
(tinyt/hf/families/): each a frozen `Family` entry naming its config keys, value spellings,
traits, weight names both ways, readers, refusals and tokenizer kind.

A new family is a new file there (and, where tinyt's model lacks a trait, a ModelConfig
option the model and the graph stages read), added to CATALOGUE below. Export-hf writes a
checkpoint as the first entry whose class holds it exactly (`writer_for`); every list of
families (the CLI's help, README's and docs/model.md's tables) is made from, or checked
against, CATALOGUE.
"""
from __future__ import annotations

from typing import Any

import torch

from tinyt.config import ModelConfig
from tinyt.errors import ConversionError
from tinyt.hf.families.bart import BART, MBART
from tinyt.hf.families.bert import BERT, DISTILBERT, ROBERTA, XLM_ROBERTA
from tinyt.hf.families.gemma import GEMMA2, GEMMA3
from tinyt.hf.families.gpt2 import GPT2
from tinyt.hf.families.llama import GRANITE, LLAMA, MISTRAL, QWEN2, QWEN3, SMOLLM3
from tinyt.hf.families.m2m100 import M2M100
from tinyt.hf.families.marian import MARIAN
from tinyt.hf.families.modernbert import MODERNBERT
from tinyt.hf.families.olmo2 import OLMO2
from tinyt.hf.families.phi3 import PHI3
from tinyt.hf.families.t5 import T5
from tinyt.hf.families.whisper import WHISPER
from tinyt.hf.family import Family, hf_config, misfit, with_head
from tinyt.hf.weights import state_from_hf
from tinyt.tokenizer import Tokenizer

# export-hf takes the first that holds a model: the plainer classes first
CATALOGUE = (GPT2, LLAMA, QWEN2, MISTRAL, QWEN3, SMOLLM3, GRANITE, GEMMA3, GEMMA2, PHI3, OLMO2,
             BERT, DISTILBERT, ROBERTA, XLM_ROBERTA, MODERNBERT,
             BART, MBART, MARIAN, M2M100, T5, WHISPER)
TASKS = {"causal_lm": "causal LMs", "classifier": "classifiers", "encoder": "encoders",
         "token_classifier": "token classifiers",
         "seq2seq": "encoder-decoders"}  # a task's name in messages
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


def seq2seq_pad(settings: dict[str, Any], tok, family: Family) -> int:
    """An encoder-decoder's pad_token_id: the tokenizer's <pad> (else its end, as tinyt's
    exported graphs pad), which must be the one the class's config says (M2M100's positions
    start after it)."""
    pad = tok.pad_id if tok.pad_id is not None else tok.eos_id
    said = settings.get("pad_token_id", pad)
    if pad is None or said != pad:
        raise ConversionError(f"a {family.architecture}'s pad_token_id is {said}, but the "
                              f"tokenizer's <pad> is {pad}: they must be one token")
    return pad


def seq2seq_config(cfg: ModelConfig, tokenizer: Tokenizer,
                   architecture: str | None = None) -> dict[str, Any]:
    """config.json of the encoder-decoder class holding cfg, as export-hf writes it, for a
    seq2seq artifact (Optimum's ORTModelForSeq2SeqLM reads the graphs by it): `architecture`
    (the class it was imported from) where that holds it, else the first that does; none, or
    a tokenizer whose <pad> is not the class's: refused by name (ConversionError)."""
    first = tuple(f for f in WRITERS if f.architecture == architecture)
    family = writer_for(cfg, "the model", among=first + WRITERS)
    hf = hf_config(family, cfg, tokenizer.eos_id, tokenizer.bos_id)
    return {**hf, "pad_token_id": seq2seq_pad(hf, tokenizer, family)}


def state_from_llama(tensors: dict[str, torch.Tensor], cfg: ModelConfig,
                     source: str) -> dict[str, torch.Tensor]:
    """HF Llama / Qwen2 tensors under tinyt's names (q, k, v and gate, up stacked): the two
    share their names, and cfg says which biases there are."""
    return state_from_hf(LLAMA, tensors, cfg, source)


__all__ = ["BART", "BERT", "CATALOGUE", "DISTILBERT", "GEMMA2", "GEMMA3", "GPT2", "GRANITE",
           "LLAMA", "M2M100", "MARIAN", "MBART", "MISTRAL", "MODERNBERT", "OLMO2", "PHI3",
           "QWEN2", "QWEN3", "ROBERTA", "SMOLLM3", "T5", "TASKS", "WHISPER", "WRITERS",
           "XLM_ROBERTA",
           "encoder_config", "family_of", "gpt2_config", "llama_config", "seq2seq_config",
           "seq2seq_pad", "state_from_llama", "writer_for"]
