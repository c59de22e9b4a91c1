"""Inputs of the decoder graph for a prefill and for each decode step (torch-free). Shared by
the runtime's generation loop and by tinyt.export's verification and accuracy checks.

    prefill: input_ids [B, T], attention_mask [B, T], position_ids from the mask, past [.., 0, ..]
    step:    input_ids [B, 1], attention_mask [B, P+1], position_ids [B, 1], past = last present
"""
from __future__ import annotations

import numpy as np

from tinyt.config import ModelConfig
from tinyt.contract import DECODER_WITH_PAST, kv_shape, past_name, past_names

# The longest sequence the stages' checks (verify, optimize, quantize, package, the shared
# cache's, the load-time probe) run, whatever the model's context: their time and memory are
# bounded by it, not by block_size (a full-block prefill of a 131,072-token Llama at batch 3
# asks for 824 GB of attention scores). 128 is the whole context of every preset with computed
# positions (demo, llama-demo), so their checks are as they were; it is longer than any
# sequence length at which a graph's behaviour can change shape (the causal triangle, masks,
# padding, positions from the mask, the fused kernels' multi-block paths). What changes beyond
# it is only the values of the positions, and those are checked where they are largest: at
# the end of the context (end_positions), with a short sequence.
CHECK_TOKENS = 128
# A learned position table is weights: each of its rows is a parameter that only a sequence
# reaching it reads, so such a model is checked over its whole block as before, up to GPT-2's
# 1024 (beyond, its last rows are reached through end_positions).
LEARNED_CHECK_TOKENS = 1024


def check_tokens(cfg: ModelConfig) -> int:
    """The longest sequence a check runs on a model of `cfg` (CHECK_TOKENS, or for a learned
    position table its block up to LEARNED_CHECK_TOKENS)."""
    cap = LEARNED_CHECK_TOKENS if cfg.pos_encoding == "learned" else CHECK_TOKENS
    return min(cfg.block_size, cap)


def window_tokens(cfg: ModelConfig) -> int | None:
    """A sequence past the sliding window, for one batch-1 case of each check where the window
    is longer than check_tokens(cfg) (Mistral's 4096): min(window + 8, block_size) tokens,
    bounded by the window, not by the context. None where check_tokens already crosses it."""
    window = cfg.sliding_window
    if window is None or window + 1 >= cfg.block_size or window + 8 <= check_tokens(cfg):
        return None
    return min(window + 8, cfg.block_size)


def end_positions(cfg: ModelConfig, n: int) -> np.ndarray:
    """The last n positions of the context, [n]: a short sequence placed at its end, where a
    position table or rotary cache that is short or wrong only at high positions shows."""
    return np.arange(cfg.block_size - n, cfg.block_size, dtype=np.int64)


def left_pad(rows: list[list[int]], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token rows of different lengths as ids and attention mask [B, T], left-padded."""
    B, T = len(rows), max(map(len, rows))
    ids = np.full((B, T), pad, dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    for r, row in enumerate(rows):
        ids[r, T - len(row):], mask[r, T - len(row):] = row, 1
    return ids, mask


def prefill_feeds(cfg: ModelConfig, kind: str, ids: np.ndarray, mask: np.ndarray | None = None,
                  *, kv_dtype=np.float32) -> dict[str, np.ndarray]:
    """Feeds that run `ids` [B, T] from scratch: past length 0, positions counted from the
    mask (so left padding does not shift them)."""
    B, T = ids.shape
    mask = np.ones((B, T), dtype=np.int64) if mask is None else mask
    feeds = {"input_ids": ids, "attention_mask": mask}
    if kind != DECODER_WITH_PAST and cfg.task != "causal_lm" and cfg.type_vocab_size >= 2:
        # an encoder's or classifier's token types: one text, every token of type 0
        feeds["token_type_ids"] = np.zeros((B, T), dtype=np.int64)
    if kind == DECODER_WITH_PAST:
        feeds["position_ids"] = np.clip(mask.cumsum(-1) - 1, 0, None)
        empty = np.zeros(kv_shape(cfg, B, 0), dtype=kv_dtype)
        feeds.update(dict.fromkeys(past_names(cfg.n_layer), empty))
    return feeds


def grow_mask(mask: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
    """The attention mask one step later. A finished sequence (active False) gets 0: its
    padding input then sees only itself and its position stops growing, so it never runs past
    block_size while the others go on."""
    col = np.ones((len(mask), 1), dtype=np.int64) if active is None else \
        np.asarray(active, dtype=np.int64)[:, None]
    return np.concatenate([mask, col], axis=1)


def step_feeds(kind: str, feeds: dict[str, np.ndarray], nxt: np.ndarray, output_names: list[str],
               outputs: list[np.ndarray], active: np.ndarray | None = None
               ) -> dict[str, np.ndarray]:
    """Feeds for the next step after `feeds` produced `outputs` and the tokens `nxt` [B] were
    chosen. Without a cache the whole sequence runs again."""
    mask = grow_mask(feeds["attention_mask"], active)
    if kind != DECODER_WITH_PAST:
        return {"input_ids": np.concatenate([feeds["input_ids"], nxt[:, None]], axis=1),
                "attention_mask": mask}
    past = {past_name(n): v for n, v in zip(output_names[1:], outputs[1:])}
    return {"input_ids": nxt[:, None].astype(np.int64), "attention_mask": mask,
            "position_ids": np.clip(mask.sum(-1, keepdims=True) - 1, 0, None), **past}


def text_cut(tokenizer, cfg: ModelConfig, fixed: dict | None = None) -> int:
    """Where an encoder's or a classifier's texts are cut: tokenizer.json's own truncation (an
    imported sentence-transformers model's max_seq_length), else the context, and a pinned
    sequence length; set as the tokenizer's truncation (which keeps a closing [SEP] / </s>),
    padding left to text_feeds."""
    trunc = tokenizer.hf.truncation
    cut = min(cfg.block_size if trunc is None else trunc["max_length"], cfg.block_size,
              (fixed or {}).get("sequence_length", cfg.block_size))
    tokenizer.hf.enable_truncation(cut)
    tokenizer.hf.no_padding()
    return cut


def text_feeds(rows, B: int, T: int, pad: int, types: bool) -> dict[str, np.ndarray]:
    """Feeds of tokenized texts, (ids, token type ids) each, right-padded to [B, T] (the mask
    hides the padding); token_type_ids where the graph takes them."""
    x = np.full((B, T), pad, dtype=np.int64)
    mask = np.zeros((B, T), dtype=np.int64)
    kinds = np.zeros((B, T), dtype=np.int64)
    for r, (row, type_ids) in enumerate(rows):
        row, type_ids = row[:T], type_ids[:T]
        x[r, :len(row)], mask[r, :len(row)], kinds[r, :len(row)] = row, 1, type_ids
    feeds = {"input_ids": x, "attention_mask": mask}
    if types:
        feeds["token_type_ids"] = kinds
    return feeds
