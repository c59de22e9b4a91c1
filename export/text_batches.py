"""Batches of text for the graphs that read a text whole (encoder, classifier, token
classifier), made as the runtime makes them (torch-free): tokenizer.json's special tokens
([CLS] ... [SEP], <s> ... </s>, a pair's second text of token type 1) and its cut
(runtime.feeds.text_cut), right padding under the attention mask and token types where the
graph takes them (runtime.feeds.text_feeds). Static calibration (qdq.py) and a classifier's
label agreement (accuracy.py) run them.

    items ──encode (special tokens, cut)──▶ (ids, type ids) per item ──text_feeds──▶
        input_ids, attention_mask (, token_type_ids) [B, longest in the batch]
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np

from tinyt.config import ModelConfig
from tinyt.contract import CLASSIFIER, ENCODER, TOKEN_CLASSIFIER, contract_for
from tinyt.runtime.feeds import text_cut, text_feeds
from tinyt.tokenizer import Tokenizer

TEXT_KINDS = (ENCODER, CLASSIFIER, TOKEN_CLASSIFIER)
Item = str | tuple[str, str]  # a text, or a pair (a classifier's: NLI, cross-encoders)
Row = tuple[list[int], list[int]]  # (ids, token type ids) of one item


@contextlib.contextmanager
def _truncation_kept(tokenizer: Tokenizer) -> Iterator[None]:
    """Put the tokenizer's truncation back as it was found (text_cut sets it)."""
    saved = tokenizer.hf.truncation
    try:
        yield
    finally:
        if saved is None:
            tokenizer.hf.no_truncation()
        else:
            tokenizer.hf.enable_truncation(**saved)


def runtime_cut(tokenizer: Tokenizer, cfg: ModelConfig) -> int:
    """Where the runtime cuts a text (text_cut), the tokenizer left as it was."""
    with _truncation_kept(tokenizer):
        return text_cut(tokenizer, cfg)


def encode_items(tokenizer: Tokenizer, cfg: ModelConfig, items: Sequence[Item], *,
                 longest: int | None = None) -> list[Row]:
    """Each item's ids and token types with the special tokens, cut where the runtime cuts
    them (text_cut: tokenizer.json's truncation, else the context), or at `longest` tokens
    where that is shorter (the cut keeps the closing [SEP]); the tokenizer left as it was."""
    with _truncation_kept(tokenizer):
        cut = text_cut(tokenizer, cfg)
        if longest is not None and longest < cut:
            tokenizer.hf.enable_truncation(longest)
        encoded = tokenizer.hf.encode_batch(list(items), add_special_tokens=True)
    return [(e.ids, e.type_ids) for e in encoded]


def batch_feeds(tokenizer: Tokenizer, cfg: ModelConfig, kind: str, rows: Sequence[Row], *,
                length: int | None = None) -> dict[str, np.ndarray]:
    """The feeds of rows [B, the longest of them, or `length`], padded with the id the runtime
    pads with (the encoder 0, a classifier its end-of-text id or 0: masked either way)."""
    types = any(s.name == "token_type_ids" for s in contract_for(cfg, kind)[0])
    pad = 0 if kind == ENCODER or tokenizer.eos_id is None else tokenizer.eos_id
    T = max(len(ids) for ids, _ in rows) if length is None else length
    return text_feeds(list(rows), len(rows), T, pad, types)
