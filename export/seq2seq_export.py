"""An encoder-decoder's ONNX export: three graphs in Optimum's seq2seq layout
(tinyt.contract.SEQ2SEQ_FILES), so ORTModelForSeq2SeqLM loads the directory (transformers.js
too, given Optimum's merged decoder besides: tests/export/test_seq2seq_transformers_js.py).

    encoder_model.onnx            the source -> its hidden states, once per batch
    decoder_model.onnx            the first step: the target so far and the hidden states ->
                                  logits, the self-attention cache, and each layer's
                                  cross-attention keys / values (computed once, here)
    decoder_with_past_model.onnx  every later step: reads both caches, grows the first

A speech model (Whisper's) has Optimum's ORTModelForSpeechSeq2Seq layout: the encoder reads
input_features (B, n_mels, 3000) and the decoders take no encoder_attention_mask.

The three share no weights on disk: each graph holds what it reads (the decoders hold the
decoder's, the encoder the encoder's; a shared embedding table is in the encoder and the
decoders both, as Optimum's export has it).
"""
from __future__ import annotations

import platform
from pathlib import Path

import onnx
import torch
import torch.nn as nn
from torch.export import Dim

from tinyt import __version__, int8
from tinyt.checkpoint import Checkpoint
from tinyt.contract import SEQ2SEQ, SEQ2SEQ_FILES, seq2seq_contract
from tinyt.fsutil import atomic_dir, write_json
from tinyt.graphio import save_graph
from tinyt.hf.speech import SPEECH_FILE, load_speech
from tinyt.manifest import checkpoint_source, io_spec, write_manifest

from . import export_cache
from .graph_names import name_axes, tidy_nodes
from .stage import Built, built

EXAMPLE_BATCH, EXAMPLE_SOURCE, EXAMPLE_TARGET, EXAMPLE_PAST = 2, 4, 3, 5  # distinct: symbolic


class EncoderGraph(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model.encode(input_ids, attention_mask)


class FirstStepGraph(nn.Module):
    """The decoder's first call: the cross keys / values made from the hidden states."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, encoder_attention_mask, input_ids, encoder_hidden_states):
        cross = self.model.cross_kv(encoder_hidden_states)
        logits, present = self.model.decode(input_ids, cross, encoder_attention_mask)
        return (logits, *(t for own, kv in zip(present, cross) for t in (*own, *kv)))


class NextStepGraph(nn.Module):
    """Every later call: both caches in, the self-attention one out, grown."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, encoder_attention_mask, input_ids, past):
        layers = [past[4 * i:4 * i + 4] for i in range(len(past) // 4)]
        own = tuple((k, v) for k, v, _, _ in layers)
        cross = tuple((ck, cv) for _, _, ck, cv in layers)
        logits, present = self.model.decode(input_ids, cross, encoder_attention_mask, own)
        return (logits, *(t for kv in present for t in kv))


class SpeechEncoderGraph(nn.Module):
    """Whisper's encoder: log-mel features -> hidden states (no mask: every frame)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_features):
        return self.model.encode(input_features)


class SpeechFirstStepGraph(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_hidden_states):
        cross = self.model.cross_kv(encoder_hidden_states)
        logits, present = self.model.decode(input_ids, cross, None)
        return (logits, *(t for own, kv in zip(present, cross) for t in (*own, *kv)))


class SpeechNextStepGraph(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, past):
        layers = [past[4 * i:4 * i + 4] for i in range(len(past) // 4)]
        own = tuple((k, v) for k, v, _, _ in layers)
        cross = tuple((ck, cv) for _, _, ck, cv in layers)
        logits, present = self.model.decode(input_ids, cross, None, own)
        return (logits, *(t for kv in present for t in kv))


WRAPPERS = {False: {"encoder": EncoderGraph, "decoder": FirstStepGraph,
                    "decoder_with_past": NextStepGraph},
            True: {"encoder": SpeechEncoderGraph, "decoder": SpeechFirstStepGraph,
                   "decoder_with_past": SpeechNextStepGraph}}  # by "is it speech"


def _speech_examples(cfg, text: dict[str, tuple[dict, dict]]) -> dict[str, tuple[dict, dict]]:
    """A speech model's examples: features of the fixed length in, no source mask."""
    features = torch.randn(EXAMPLE_BATCH, cfg.n_mels, 2 * cfg.source_positions,
                           generator=torch.Generator().manual_seed(0))
    out = {"encoder": ({"input_features": features}, {"input_features": {0: Dim.DYNAMIC}})}
    for role in ("decoder", "decoder_with_past"):
        kwargs, shapes = text[role]
        out[role] = ({k: v for k, v in kwargs.items() if k != "encoder_attention_mask"},
                     {k: v for k, v in shapes.items() if k != "encoder_attention_mask"})
    return out


def _examples(cfg) -> dict[str, tuple[dict, dict]]:
    """Each graph's example kwargs and dynamic shapes."""
    B, E, T, P = EXAMPLE_BATCH, EXAMPLE_SOURCE, EXAMPLE_TARGET, EXAMPLE_PAST
    g = torch.Generator().manual_seed(0)
    dyn = Dim.DYNAMIC
    ids = torch.randint(0, cfg.vocab_size, (B, E), generator=g)
    target = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    mask = torch.ones(B, E, dtype=torch.long)
    hidden = torch.randn(B, E, cfg.n_embd, generator=g)
    kv = (B, cfg.kv_heads, None, cfg.head_dim)
    past = []
    for _ in range(cfg.decoder_layers):
        past += [torch.randn(*kv[:2], P, kv[3], generator=g) for _ in range(2)]
        past += [torch.randn(*kv[:2], E, kv[3], generator=g) for _ in range(2)]
    both = {0: dyn, 1: dyn}
    text = {
        "encoder": ({"input_ids": ids, "attention_mask": mask},
                    {"input_ids": both, "attention_mask": both}),
        "decoder": ({"encoder_attention_mask": mask, "input_ids": target,
                     "encoder_hidden_states": hidden},
                    {"encoder_attention_mask": both, "input_ids": both,
                     "encoder_hidden_states": both}),
        "decoder_with_past": ({"encoder_attention_mask": mask, "input_ids": target,
                               "past": past},
                              {"encoder_attention_mask": both, "input_ids": both,
                               "past": [{0: dyn, 2: dyn}] * len(past)}),
    }
    return text if cfg.n_mels is None else _speech_examples(cfg, text)


def export_seq2seq(ckpt: Checkpoint, checkpoint_dir: Path, out_dir: Path, *, opset: int,
                   external_data: bool | None, hf_config: dict) -> Built:
    """Write the three graphs, the tokenizer, config.json and generation_config.json."""
    cfg = ckpt.config
    model = ckpt.model.eval()
    wrappers = WRAPPERS[cfg.n_mels is not None]
    contract = seq2seq_contract(cfg)
    examples = _examples(cfg)
    protos = {}
    for role, wrap in wrappers.items():
        inputs, outputs = contract[role]
        kwargs, shapes = examples[role]
        proto = export_cache.export(wrap(model).eval(), kwargs=kwargs, shapes=shapes,
                                    opset=opset, input_names=[t.name for t in inputs],
                                    output_names=[t.name for t in outputs],
                                    what=f"{role} {cfg!r}")
        name_axes(proto, inputs, outputs)
        tidy_nodes(proto, wrapped=True)
        proto.producer_name, proto.producer_version = "tinyt", __version__
        protos[role] = proto
    with atomic_dir(out_dir) as tmp:
        split = False
        for role, proto in protos.items():
            path = tmp / SEQ2SEQ_FILES[role]
            split |= len(save_graph(proto, path, external=external_data)) > 1
            onnx.checker.check_model(str(path), full_check=True)
        ckpt.tokenizer.save(tmp / "tokenizer.json")
        # transformers saves it for every encoder-decoder; transformers.js reads the model as
        # one (its cache names, its generate loop) only where config.json says so
        write_json(tmp / "config.json", {**hf_config, "is_encoder_decoder": True})
        speech = load_speech(checkpoint_dir)  # Whisper's: its own, and its tokens' ids
        write_json(tmp / "generation_config.json", speech["generation_config"] if speech
                   and speech["generation_config"] else generation_config(cfg, ckpt.tokenizer))
        if speech is not None:
            write_json(tmp / SPEECH_FILE, speech)
        written = write_manifest(tmp, stage="export", source=checkpoint_source(checkpoint_dir),
                                 options={"opset": opset, "with_past": True,
                                          "external_data": split}, extra={
            "graph": SEQ2SEQ, "opset": opset,
            "int8": {file: int8.fp32_entry() for file in SEQ2SEQ_FILES.values()},
            "io": {SEQ2SEQ_FILES[r]: io_spec(*contract[r]) for r in contract},
            "exporter": "torch.onnx.export(dynamo=True)",
            "versions": {"torch": torch.__version__, "onnx": onnx.__version__,
                         "tinyt": __version__, "python": platform.python_version()},
        })
    return built(out_dir, written)


def generation_config(cfg, tokenizer) -> dict:
    """generation_config.json: the decoder's first token, where it stops, its padding, and
    the first token generated where it is forced (BART-large-CNN's <s>, M2M100's language)."""
    eos = tokenizer.eos_id
    pad = getattr(tokenizer, "pad_id", None)
    forced = {} if cfg.forced_bos_id is None else {"forced_bos_token_id": cfg.forced_bos_id}
    if cfg.bad_word_ids:  # never generated (Opus-MT's pad)
        forced["bad_words_ids"] = [[i] for i in cfg.bad_word_ids]
    return {"decoder_start_token_id": cfg.decoder_start_id, "eos_token_id": eos,
            "pad_token_id": eos if pad is None else pad, "max_length": cfg.block_size,
            "do_sample": False, "num_beams": 1, **forced}
