"""Hugging Face directories in and out, for every catalogue entry (torch; transformers to write).

    HF dir (config.json, model.safetensors | shards, tokenizer files)
        ──import_hf──▶ tinyt checkpoint ──to_hf──▶ HF dir (outputs checked)

In: the entry of config.json's model_type reads the config, the tokenizer and the weights;
`tinyt.checkpoint.save_import` writes the checkpoint (every importer's tail). Out: the class the
checkpoint was imported as, else the first entry whose class holds the model exactly, is built
by transformers from the entry's config.json, given the weights under its names, and compared
with tinyt (logits, an encoder-decoder's teacher-forced; an encoder's hidden states;
HF_LOGITS_ATOL) before anything is written.
The written config.json carries a `tinyt` block with what an import restores that the layout
spells otherwise (a bias-free GPT-2's zero biases, the tokenizer's settings) and what the
directory holds that is not the original model's (a base encoder's pooler, written as zeros);
an encoder with a pooling is written in sentence-transformers' layout.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from tinyt.hf.catalogue import GPT2, WRITERS, family_of, seq2seq_pad, writer_for
from tinyt.hf.family import Family, config_from_hf, for_class, hf_config, labels_of
from tinyt.hf.sentence import LEGACY, MODULES, POOLING, read_sentence_modules
from tinyt.hf.speech import SPEECH_FILE, load_speech, read_speech
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
    (GPT2LMHeadModel, LlamaForCausalLM, ..., BertModel, ..., T5ForConditionalGeneration), or
    from a GGUF file of a Llama (tinyt/hf/gguf.py); returns out. An encoder-decoder's
    generation_config.json start and forced first token are read over config.json's.

    context: keep a shorter context than the model's max_position_embeddings (block_size = N,
    2 <= N <= the model's). Exact for the positions kept: computed rotary positions do not
    depend on it (refused where a rope scaling would), and a learned table (GPT-2) keeps its
    first N rows. The checkpoint's metrics record {"context": N, "model_context": the model's}."""
    directory, out = Path(directory), Path(out)
    if directory.is_file():  # a GGUF file (llama.cpp's): its own reader, the same tail
        return _import_gguf(directory, out, context=context, log=log)
    if not directory.is_dir():
        raise CheckpointError(f"Hugging Face model directory {directory} does not exist")
    check_import_target(out)
    sentence = read_sentence_modules(directory)
    root = directory if sentence is None else sentence.transformer
    hf_cfg = read_json_object(root / "config.json", CheckpointError)
    family = for_class(family_of(hf_cfg, str(root / "config.json")), hf_cfg,
                       str(root / "config.json"))
    if family.task == "seq2seq":  # generate's settings, where newer saves move them
        hf_cfg = {**hf_cfg, **_generation_settings(root)}
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
    if cfg.task not in ("causal_lm", "seq2seq"):  # texts cut as the model was run: its own
        #                                          length, else its context
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
    files = None
    if cfg.n_mels is not None:  # Whisper's tokens and generation settings, kept beside
        speech = read_speech(root, hf_cfg, tok, cfg)
        files = lambda tmp: write_json(tmp / SPEECH_FILE, speech)  # noqa: E731
        log(f"speech: {len(speech['tokens']['languages'])} languages, "
            f"{speech['tokens']['timestamps']} timestamps")
    kept = {}
    if context is not None:
        cfg, state = shorter_context(cfg, state, context, str(directory / "config.json"))
        kept = {"context": cfg.block_size, "model_context": model_context}
        log(f"context: {cfg.block_size} of the model's {model_context} tokens")
    return save_import(out, cfg, tok, state, source=source, log=log, labels=labels,
                       files=files, metrics={
        "imported_from": "huggingface", "architecture": family.architecture,
        "source_dir": str(directory.resolve()), **kept})


def _import_gguf(path: Path, out: Path, *, context: int | None,
                 log: Callable[[str], None]) -> Path:
    """import_hf of a GGUF file: tinyt.hf.gguf reads it; the checkpoint also holds the
    file's Q4_0 / Q4_1 / Q8_0 blocks (gguf.BLOCKS_FILE) for the quantize stage."""
    from tinyt.hf.gguf import BLOCKS_FILE, read_gguf_model, write_blocks

    check_import_target(out)
    read = read_gguf_model(path, log)
    cfg, state, kept = read.config, read.state, {}
    if context is not None:
        cfg, state = shorter_context(cfg, state, context, f"GGUF file {path}")
        kept = {"context": cfg.block_size, "model_context": read.config.block_size}
        log(f"context: {cfg.block_size} of the model's {read.config.block_size} tokens")
    return save_import(out, cfg, read.tokenizer, state, source=f"GGUF file {path}", log=log,
                       metrics={**read.metrics, **kept},
                       files=lambda tmp: write_blocks(tmp / BLOCKS_FILE, read.blocks))


# generation_config.json's keys an encoder-decoder's import reads over config.json's
# (the end is read with the tokenizer; the padding stays the model's, as its positions do)
GENERATION_KEYS = ("decoder_start_token_id", "forced_bos_token_id", "bos_token_id",
                   "bad_words_ids")


def _generation_settings(directory: Path) -> dict[str, Any]:
    """generation_config.json's start, forced first token and special ids, as transformers'
    generate reads them over config.json's ({} without the file)."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return {}
    gen = read_json_object(path, CheckpointError)
    return {k: gen[k] for k in GENERATION_KEYS if k in gen}


def shorter_context(cfg: ModelConfig, state: dict[str, torch.Tensor], context: int,
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
def to_hf(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
          log: Callable[[str], None] = lambda s: None) -> Path:
    """`tinyt export-hf`: a checkpoint as the class it was imported as (its metrics'
    `architecture`) where that holds it, else the first catalogue class that holds it exactly
    (tinyt.hf.catalogue.WRITERS' order: GPT2LMHeadModel, LlamaForCausalLM, ..., BertModel,
    ..., BartForConditionalGeneration, ..., BertForSequenceClassification, ...); returns
    out_dir. An encoder with a pooling is written
    in sentence-transformers' layout around its class."""
    ckpt = load_checkpoint(checkpoint_dir)
    arch = (ckpt.meta.get("metrics") or {}).get("architecture")
    first = tuple(f for f in WRITERS if f.architecture == arch)  # XLM-R holds RoBERTa's models
    family = writer_for(ckpt.config, str(checkpoint_dir),
                        among=first + tuple(f for f in WRITERS if f.architecture != arch))
    return _write_hf(family, ckpt, checkpoint_dir, out_dir, log)


def to_hf_gpt2(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write a tinyt causal-LM checkpoint as a Hugging Face GPT-2 directory; returns out_dir."""
    ckpt = load_checkpoint(checkpoint_dir)
    family = writer_for(ckpt.config, str(checkpoint_dir), among=(GPT2,))
    return _write_hf(family, ckpt, checkpoint_dir, out_dir)


# what a written base encoder holds that tinyt's checkpoint has not (its import drops it)
POOLER_NOTE = ("zeros, not the original model's: tinyt's import drops the base model's pooler "
               "(no sentence-transformers or tinyt embedding uses it) and {arch} always has "
               "one, so its pooler_output is 0")
# an encoder tokenizer's special tokens by their usual names (BERT's, then RoBERTa's / XLM-R's),
# for transformers' tokenizer_config.json (its padding, [CLS] / <s> roles)
ENCODER_SPECIALS = {"unk_token": ("[UNK]", "<unk>"), "pad_token": ("[PAD]", "<pad>"),
                    "cls_token": ("[CLS]", "<s>"), "sep_token": ("[SEP]", "</s>"),
                    "mask_token": ("[MASK]", "<mask>")}


def _write_hf(family: Family, ckpt: Checkpoint, checkpoint_dir: str | os.PathLike,
              out_dir: str | os.PathLike, log: Callable[[str], None] = lambda s: None) -> Path:
    """The export tail: transformers' model of the entry with tinyt's weights, its outputs
    checked, then saved with the tokenizer files (and an encoder's sentence-transformers
    modules)."""
    import transformers

    cfg, tok = ckpt.config, ckpt.tokenizer
    settings = {k: v for k, v in hf_config(family, cfg, tok.eos_id, tok.bos_id).items()
                if k not in ("model_type", "architectures")}
    if cfg.task in ("classifier", "token_classifier"):
        settings.update(id2label=dict(enumerate(ckpt.labels)),
                        label2id={n: i for i, n in enumerate(ckpt.labels)})
    if cfg.task == "seq2seq":
        settings["pad_token_id"] = seq2seq_pad(settings, tok, family)
    elif cfg.task != "causal_lm":  # the special tokens' ids as the tokenizer has them (a class's
        roles = _encoder_tokens(tok, cfg)  # defaults are its real vocabulary's: ModernBERT's
        settings.update({f"{role}_id": tok.hf.token_to_id(roles[role])  # pad is 50,283)
                         for role in ("pad_token", "cls_token", "sep_token") if role in roles})
    speech = load_speech(checkpoint_dir)  # Whisper's generation settings, as they came
    if speech is not None:
        settings.update(speech["config"])
    hf_class = getattr(transformers, family.architecture)
    if cfg.attn_softcap is not None:  # transformers' SDPA path leaves Gemma 2's cap out
        settings["attn_implementation"] = "eager"
    hf = hf_class(transformers.AutoConfig.for_model(family.model_type, **settings)).eval()
    state = hf_state(family, ckpt.model)
    if not any(k.startswith(family.base) for k in hf.state_dict()):  # a base-model class
        # (BertModel) names its tensors without the prefix its task classes add
        state = {k.removeprefix(family.base): v for k, v in state.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    zeroed = sorted(k for k in missing if family.drops and k.endswith(family.drops))
    shared = family.shared if cfg.task == "seq2seq" and cfg.shared_embeddings else ()
    missing = [k for k in missing if not k.endswith(family.buffers) and k not in zeroed
               and not (k == family.head and cfg.tie_weights) and k not in shared]
    if missing or unexpected:
        raise ConversionError(f"weights did not map: missing {missing}, unexpected {unexpected}")
    if cfg.tie_weights:
        hf.tie_weights()
    with torch.no_grad():
        for name in zeroed:  # never random: transformers would draw one at each load
            hf.get_parameter(name).zero_()
    if zeroed:
        log(f"{family.architecture}'s pooler {zeroed}: " + POOLER_NOTE.format(
            arch=family.architecture))
    output, worst = _check_outputs(ckpt.model, hf, family, cfg)
    with atomic_dir(out_dir) as tmp:
        hf.save_pretrained(tmp, safe_serialization=True)
        tok.save(tmp / "tokenizer.json")  # an encoder's keeps its truncation
        write_json(tmp / "tokenizer_config.json", {
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.block_size,
            **(family.special_tokens(tok) if cfg.task in ("causal_lm", "seq2seq") else
               _encoder_tokens(tok, cfg))})
        if cfg.task == "encoder" and cfg.pooling is not None:
            _write_sentence_modules(tmp, cfg, tok)
        meta = json.loads((tmp / "config.json").read_text())
        meta["tinyt"] = {"source": str(Path(checkpoint_dir).resolve()),
                         f"{output}_max_abs_diff": worst,
                         "bias": cfg.bias, "tokenizer": tok.settings}  # what import restores
        if zeroed:
            meta["tinyt"]["pooler"] = {"tensors": zeroed, "weights": POOLER_NOTE.format(
                arch=family.architecture)}
        if speech is not None:  # where the source had them (transformers moves them)
            meta.update(speech["config"])
            if speech["generation_config"]:
                write_json(tmp / "generation_config.json", speech["generation_config"])
        write_json(tmp / "config.json", meta)
    return Path(out_dir)


def _encoder_tokens(tok, cfg: ModelConfig) -> dict[str, Any]:
    """tokenizer_config.json's roles of an encoder's special tokens, found by their usual
    names, and the inputs its class takes (DistilBertModel has no token_type_ids; RoBERTa's
    one-row table is not fed), so transformers' tokenizer pads and feeds as the model runs."""
    roles = {role: next(n for n in names if tok.hf.token_to_id(n) is not None)
             for role, names in ENCODER_SPECIALS.items()
             if any(tok.hf.token_to_id(n) is not None for n in names)}
    inputs = ["input_ids", *(["token_type_ids"] if cfg.type_vocab_size >= 2 else []),
              "attention_mask"]
    return {**roles, **tok.settings, "model_input_names": inputs}


def _write_sentence_modules(directory: Path, cfg: ModelConfig, tok) -> None:
    """sentence-transformers' layout around the written class, as it saves all-MiniLM-L6-v2:
    modules.json (Transformer, Pooling, Normalize when normalized), 1_Pooling/config.json in its
    boolean form, sentence_bert_config.json with where texts are cut (the tokenizer's
    truncation, else the context)."""
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if cfg.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (directory / "2_Normalize").mkdir()
    write_json(directory / MODULES, modules)
    mode = next(st for st, ours in POOLING.items() if ours == cfg.pooling)
    (directory / "1_Pooling").mkdir()
    write_json(directory / "1_Pooling" / "config.json", {
        "word_embedding_dimension": cfg.n_embd,
        **{key: st == mode for key, st in LEGACY.items()}, "include_prompt": True})
    cut = (tok.hf.truncation or {}).get("max_length", cfg.block_size)
    write_json(directory / "sentence_bert_config.json",
               {"max_seq_length": min(cut, cfg.block_size), "do_lower_case": False})


def _check_outputs(model, hf, family: Family, cfg: ModelConfig) -> tuple[str, float]:
    """The output compared (logits, or an encoder's last_hidden_state) and its max abs
    difference from tinyt's; refused above HF_LOGITS_ATOL."""
    if cfg.task == "causal_lm":
        output, worst = "logits", _logits_diff(model, hf, cfg)
    elif cfg.task == "seq2seq":
        output, worst = "logits", (_seq2seq_diff if cfg.n_mels is None else _speech_diff)(
            model, hf, cfg)
    else:
        output, worst = _encoder_diff(model, hf, cfg)
    if not worst <= HF_LOGITS_ATOL:
        raise ConversionError(f"the {family.architecture}'s {output} differ from tinyt's by "
                              f"{worst:.3g} (allowed {HF_LOGITS_ATOL})")
    return output, worst


def _logits_diff(model, hf, cfg: ModelConfig) -> float:
    """Max abs logits difference on two random prompts. A learned position table is checked
    row by row (the whole block); computed positions need no more than CHECK_TOKENS."""
    T = cfg.block_size if cfg.pos_encoding == "learned" else min(cfg.block_size, CHECK_TOKENS)
    ids = torch.randint(0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return float((model.eval()(ids)[0] - hf(ids).logits).abs().max())


def _seq2seq_diff(model, hf, cfg: ModelConfig) -> float:
    """Teacher-forced logits' max abs difference: a source batch right-padded with the model's
    pad (CHECK_TOKENS, half, two tokens) and a target of half as many from decoder_start_id,
    no real token the pad (M2M100 numbers positions from the ids). Not a learned table's
    every row, as _logits_diff checks GPT-2's: 3 x 1,024 targets at BART's 50,265 ids are
    600 MB of logits a side, and the table is copied whole (an offset shows from row 0)."""
    S = min(cfg.block_size, CHECK_TOKENS)
    T = max(S // 2, 2)  # past T5's 16 exact decoder buckets
    g = torch.Generator().manual_seed(0)
    pad = hf.config.pad_token_id
    mask = (torch.arange(S)[None] < torch.tensor([S, S // 2, 2])[:, None]).long()  # (3, S)
    ids = torch.randint(0, cfg.vocab_size - 1, (3, S), generator=g)
    ids = torch.where(mask.bool(), ids + (ids >= pad).long(), pad)
    target = torch.randint(0, cfg.vocab_size - 1, (3, T), generator=g)
    target = target + (target >= pad).long()
    target[:, 0] = cfg.decoder_start_id
    with torch.no_grad():
        ours = model.eval()(ids, mask, target)
        theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
    return float((ours - theirs).abs().max())


def _speech_diff(model, hf, cfg: ModelConfig) -> float:
    """An audio encoder-decoder's teacher-forced logits' max abs difference: two sources of
    features in log-mel's range ([-1.5, 1.5]: (log10 + 4) / 4) and a target of CHECK_TOKENS
    // 2 tokens from decoder_start_id."""
    g = torch.Generator().manual_seed(0)
    features = torch.rand(2, cfg.n_mels, 2 * cfg.source_positions, generator=g) * 3 - 1.5
    target = torch.randint(0, cfg.vocab_size, (2, min(cfg.block_size, CHECK_TOKENS // 2)),
                           generator=g)
    target[:, 0] = cfg.decoder_start_id
    with torch.no_grad():
        ours = model.eval()(features, None, target)
        theirs = hf(input_features=features, decoder_input_ids=target).logits
    return float((ours - theirs).abs().max())


def _encoder_diff(model, hf, cfg: ModelConfig) -> tuple[str, float]:
    """An encoder's hidden states, a token classifier's logits (real tokens: padding's are
    unspecified) or a sequence classifier's logits, on a right-padded batch of three rows: the
    whole position table (computed positions: CHECK_TOKENS, or past twice a window, never the
    whole 8,192-token context a ModernBERT has), half of it, two tokens; random token types
    where there is a table."""
    T = cfg.block_size if cfg.pos_encoding == "learned" else min(
        cfg.block_size, max(CHECK_TOKENS, 2 * (cfg.sliding_window or 0) + 8))
    g = torch.Generator().manual_seed(0)
    pad = hf.config.pad_token_id or 0  # RoBERTa numbers its positions from the ids' padding
    mask = (torch.arange(T)[None] < torch.tensor([T, T // 2, 2])[:, None]).long()  # (3, T)
    ids = torch.randint(0, cfg.vocab_size - 1, (3, T), generator=g)
    ids = torch.where(mask.bool(), ids + (ids >= pad).long(), pad)  # no real token is padding
    types = torch.randint(0, max(cfg.type_vocab_size, 1), (3, T), generator=g) * mask
    typed = {"token_type_ids": types} if cfg.type_vocab_size else {}
    with torch.no_grad():
        ours = model.eval()(ids, mask, types if cfg.type_vocab_size else None)
        theirs = hf(input_ids=ids, attention_mask=mask, **typed)
    if cfg.task == "encoder":
        ours, output = (ours[0] if isinstance(ours, tuple) else ours), "last_hidden_state"
        theirs = theirs.last_hidden_state
    else:
        output, theirs = "logits", theirs.logits
    diff = (ours - theirs).abs()  # (3, T, C) or (3, num_labels)
    return output, float(diff[mask.bool()].max() if diff.dim() == 3 else diff.max())
