"""A small random encoder-decoder for the seq2seq tests (runtime, server, packages, page):
weights drawn at WEIGHT_STD make each step's choice clear (a near-uniform distribution would
leave the order of candidates to rounding), and a bias on the end-of-sequence logit (EOS_BOOST)
ends hypotheses at many lengths."""
from __future__ import annotations

from pathlib import Path

import torch

from tinyt.config import ModelConfig
from tinyt.model import build_model
from tinyt.tokenizer import Tokenizer

WEIGHT_STD = 0.3
EOS_BOOST = 3.5
LANGS = ["__de__", "__fr__"]  # M2M100's spelling, added to the byte-level tokenizer
SHAPE = dict(task="seq2seq", n_layer=2, n_head=4, n_embd=64, block_size=64)
T5_FORM = dict(pos_encoding="relative", norm="rmsnorm", bias=False, activation="geglu_tanh",
               attention_multiplier=1.0, tie_weights=False)


def byte_tokenizer() -> Tokenizer:
    """tinyt's byte-level tokenizer with LANGS added."""
    tok = Tokenizer.byte_level()  # 256 bytes, <|endoftext|> = 256 (eos)
    tok.hf.add_special_tokens(LANGS)  # 257, 258
    return tok


def random_seq2seq(**form):
    """A random encoder-decoder on the byte-level tokenizer (form: config overrides, e.g.
    T5_FORM): (the torch model, its tokenizer)."""
    torch.manual_seed(0)
    tok = byte_tokenizer()
    cfg = ModelConfig(**SHAPE, vocab_size=tok.vocab_size, final_logits_bias=True, **form)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, WEIGHT_STD)
        model.final_logits_bias[0, tok.eos_id] = EOS_BOOST
    return model, tok


def seq2seq_artifact(root: Path, form: str = "learned"):
    """(the torch model, its exported artifact's directory under `root`): form 'learned'
    (tinyt's own positions) or 't5' (T5_FORM)."""
    from tinyt.checkpoint import save_checkpoint
    from tinyt.export.exporter import export_onnx

    model, tok = random_seq2seq(**({} if form == "learned" else T5_FORM))
    save_checkpoint(root / "ck", model, tok)
    return model, export_onnx(root / "ck", root / "onnx")


def exported_seq2seq(root: Path, quantized: tuple[int, ...] = ()) -> dict[str, Path]:
    """seq2seq_artifact's fp32 export, and the seq2seq quantize stage's at each of
    `quantized` bits: {"fp32": ..., "int8": ..., "int4": ...}."""
    from tinyt.export.quantize import quantize

    made = {"fp32": seq2seq_artifact(root)[1]}
    for bits in quantized:
        made[f"int{bits}"] = quantize(made["fp32"], root / f"int{bits}", bits=bits)
    return made
