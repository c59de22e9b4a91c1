"""ONNX export: checkpoint directory in, artifact directory out.

    checkpoint/ ──load──▶ wrapper (flat I/O, contract names) ──torch.onnx.export(dynamo)──▶
        name symbolic axes after the contract ──check_model(full_check)──▶ onnx/ + manifest

The dynamo exporter is used, not the TorchScript one: it keeps every contract axis symbolic,
stores the tied embedding / lm_head matrix once (TorchScript's constant folding stores it
twice), and its graphs are the ones onnxscript's ORT fusions rewrite (see README, "Exporter
choice", and lab/compare_exporters.py for the measurement).
"""
from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

import onnx
import torch
import torch.nn as nn
from torch.export import Dim

from tinyt import __version__
from tinyt.checkpoint import load_checkpoint
from tinyt.config import ModelConfig
from tinyt.contract import (
    CLASSIFIER,
    DECODER,
    DECODER_WITH_PAST,
    ENCODER,
    ONNX_FILE,
    SEQ2SEQ,
    TOKEN_CLASSIFIER,
    contract_for,
    kv_shape,
)
from tinyt.errors import ConversionError, ExportError
from tinyt.export.genai_config import write_genai_config
from tinyt.fsutil import atomic_dir, write_json
from tinyt.graphio import save_graph
from tinyt.hf import encoder_config, gpt2_config, llama_config, seq2seq_config
from tinyt.manifest import check_output_dir, checkpoint_source, io_spec, write_manifest

from . import export_cache
from .graph_names import name_axes, tidy_nodes
from .stage import Built, built

# torch's exporter warns on every export that torchvision (whose ops tinyt never uses) is
# missing; a user reads that as a problem with their model.
logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)

DEFAULT_OPSET = 18
MIN_OPSET = 18  # torch's dynamo exporter (onnxscript torchlib) writes opset 18 and later
# Example sizes: >= 2 and distinct, so no axis can be specialised to a constant.
EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PAST = 2, 3, 5


class DecoderWithPast(nn.Module):
    """Flat I/O in contract order: one graph for prefill (past length 0) and decode."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, past):
        pairs = tuple((past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2))
        logits, present = self.model(input_ids, attention_mask, position_ids, pairs)
        return (logits, *(t for kv in present for t in kv))


class Decoder(nn.Module):
    """No cache: input_ids, attention_mask -> logits (positions come from the mask)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids, attention_mask)[0]


class Encoder(nn.Module):
    """An encoder's flat outputs: last_hidden_state (and sentence_embedding) as a tuple."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        out = self.model(input_ids, attention_mask, token_type_ids)
        return out if isinstance(out, tuple) else (out,)


def graph_kind(cfg: ModelConfig, with_past: bool) -> str:
    if cfg.task == "seq2seq":
        return SEQ2SEQ
    if cfg.task == "classifier":
        return CLASSIFIER
    if cfg.task == "encoder":
        return ENCODER
    if cfg.task == "token_classifier":
        return TOKEN_CLASSIFIER
    return DECODER_WITH_PAST if with_past else DECODER


def _example(cfg: ModelConfig, kind: str):
    """Example kwargs and their dynamic shapes for the exporter."""
    B, S, P = EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_PAST
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (B, S), generator=g)
    dyn = Dim.DYNAMIC
    if kind != DECODER_WITH_PAST:
        kwargs = {"input_ids": ids, "attention_mask": torch.ones(B, S, dtype=torch.long)}
        shapes = {"input_ids": {0: dyn, 1: dyn}, "attention_mask": {0: dyn, 1: dyn}}
        if cfg.type_vocab_size >= 2:  # the contract's token_type_ids (encoders, classifiers)
            kwargs["token_type_ids"] = torch.randint(0, cfg.type_vocab_size, (B, S), generator=g)
            shapes["token_type_ids"] = {0: dyn, 1: dyn}
        return kwargs, shapes
    past = [torch.randn(kv_shape(cfg, B, P), generator=g)
            for _ in range(2 * cfg.n_layer)]
    kwargs = {"input_ids": ids, "attention_mask": torch.ones(B, P + S, dtype=torch.long),
              "position_ids": torch.arange(P, P + S).repeat(B, 1), "past": past}
    shapes = {"input_ids": {0: dyn, 1: dyn}, "attention_mask": {0: dyn, 1: dyn},
              "position_ids": {0: dyn, 1: dyn}, "past": [{0: dyn, 2: dyn}] * len(past)}
    return kwargs, shapes


def hf_config(cfg: ModelConfig, tokenizer, labels, kind: str,
              architecture: str | None = None) -> dict:
    """config.json: Hugging Face gpt2 (or llama / qwen2) keys, so Optimum loads the LM, plus a
    `tinyt` block."""
    eos = tokenizer.eos_id
    tinyt_block = {"model": cfg.to_dict(), "graph": kind, "labels": labels,
                   "tinyt_version": __version__}
    if kind == SEQ2SEQ:  # Optimum's ORTModelForSeq2SeqLM reads the graphs by the family's
        try:  # config, as export-hf writes it, where a family's class holds the model
            hf = seq2seq_config(cfg, tokenizer, architecture)
        except ConversionError:
            hf = {"model_type": "tinyt-seq2seq", "is_encoder_decoder": True,
                  "vocab_size": cfg.vocab_size, "d_model": cfg.n_embd,
                  "decoder_start_token_id": cfg.decoder_start_id, "eos_token_id": eos,
                  "pad_token_id": eos if tokenizer.pad_id is None else tokenizer.pad_id}
        return {**hf, "tinyt": tinyt_block}
    if kind == ENCODER:  # Optimum's ORTModelForFeatureExtraction reads it by its family
        try:
            hf = encoder_config(cfg, architecture)
        except ConversionError:
            hf = {"model_type": "tinyt-encoder", "hidden_size": cfg.n_embd}
        return {**hf, "tinyt": tinyt_block}
    if kind in (CLASSIFIER, TOKEN_CLASSIFIER):  # an imported head's class where one holds it
        try:
            hf = encoder_config(cfg, architecture)
        except ConversionError:
            hf = {"model_type": "tinyt-classifier", "pad_token_id": eos}
        return {**hf, "num_labels": cfg.num_labels,
                "id2label": {str(i): n for i, n in enumerate(labels)},
                "label2id": {n: i for i, n in enumerate(labels)}, "tinyt": tinyt_block}
    if cfg.llama_options:  # Optimum reads a Llama-family graph by its Llama config
        try:
            hf = llama_config(cfg, tokenizer)
        except ConversionError:  # a mix of the two forms: no Hugging Face class holds it
            hf = {"model_type": "tinyt-decoder", "vocab_size": cfg.vocab_size,
                  "eos_token_id": eos, "pad_token_id": eos}
        return {**hf, "use_cache": kind == DECODER_WITH_PAST, "tinyt": tinyt_block}
    return {**gpt2_config(cfg, eos), "tie_word_embeddings": cfg.tie_weights,
            "use_cache": kind == DECODER_WITH_PAST, "tinyt": tinyt_block}


def _check_opset(opset: int) -> None:
    newest = onnx.defs.onnx_opset_version()
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise ExportError(f"opset={opset!r} cannot be written here: allowed {MIN_OPSET}..{newest} "
                          f"(torch's dynamo exporter starts at {MIN_OPSET}; onnx "
                          f"{onnx.__version__} knows up to {newest})")


def export_onnx(checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                opset: int = DEFAULT_OPSET, with_past: bool = True,
                external_data: bool | None = None) -> Built:
    """Export a checkpoint to an ONNX artifact directory (written atomically); returns it.

    Causal LMs get one decoder graph with a KV cache (with_past=True) or a no-cache graph;
    classifiers get input_ids, attention_mask -> logits. external_data: weights in
    model.onnx.data (None: when they pass tinyt.graphio's threshold, below protobuf's 2 GB)."""
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    check_output_dir(checkpoint_dir, out_dir)
    _check_opset(opset)
    ckpt = load_checkpoint(checkpoint_dir)
    cfg = ckpt.config
    kind = graph_kind(cfg, with_past)
    if kind == SEQ2SEQ:
        if not with_past:
            raise ExportError("an encoder-decoder exports with its caches (Optimum's three "
                              "graphs); --no-cache is for decoder-only LMs")
        from .seq2seq_export import export_seq2seq
        architecture = (ckpt.meta.get("metrics") or {}).get("architecture")
        return export_seq2seq(ckpt, checkpoint_dir, out_dir, opset=opset,
                              external_data=external_data,
                              hf_config=hf_config(cfg, ckpt.tokenizer, ckpt.labels, kind,
                                                  architecture))
    wrapper = {DECODER_WITH_PAST: DecoderWithPast, DECODER: Decoder, ENCODER: Encoder,
               CLASSIFIER: lambda m: m, TOKEN_CLASSIFIER: lambda m: m}[kind](ckpt.model).eval()
    inputs, outputs = contract_for(cfg, kind)
    kwargs, shapes = _example(cfg, kind)
    proto = export_cache.export(wrapper, kwargs=kwargs, shapes=shapes, opset=opset,
                                input_names=[t.name for t in inputs],
                                output_names=[t.name for t in outputs], what=f"{kind} {cfg!r}")
    name_axes(proto, inputs, outputs)
    tidy_nodes(proto, wrapped=kind not in (CLASSIFIER, TOKEN_CLASSIFIER))
    proto.producer_name, proto.producer_version = "tinyt", __version__
    with atomic_dir(out_dir) as tmp:
        files = save_graph(proto, tmp / ONNX_FILE, external=external_data)
        onnx.checker.check_model(str(tmp / ONNX_FILE), full_check=True)  # by path: any size
        ckpt.tokenizer.save(tmp / "tokenizer.json")
        write_json(tmp / "config.json", hf_config(
            cfg, ckpt.tokenizer, ckpt.labels, kind,
            architecture=(ckpt.meta.get("metrics") or {}).get("architecture")))
        eos = ckpt.tokenizer.eos_id
        write_json(tmp / "generation_config.json", {
            "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos,
            "max_length": cfg.block_size, "do_sample": False})
        write_genai_config(tmp, cfg, kind=kind)
        written = write_manifest(tmp, stage="export", source=checkpoint_source(checkpoint_dir),
                                 options={"opset": opset, "with_past": with_past,
                    "external_data": len(files) > 1}, extra={
            "graph": kind, "opset": opset, "io": io_spec(inputs, outputs),
            "exporter": "torch.onnx.export(dynamo=True)",
            "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                         "tinyt": __version__, "python": platform.python_version()},
        })
    return built(out_dir, written)
