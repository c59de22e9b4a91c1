"""Inputs of the decoder graph for a prefill and for each decode step (torch-free). Shared by
the runtime's generation loop and by tinyt.export's verification and accuracy checks.

    prefill: input_ids [B, T], attention_mask [B, T], position_ids from the mask, past [.., 0, ..]
    step:    input_ids [B, 1], attention_mask [B, P+1], position_ids [B, 1], past = last present
"""
from __future__ import annotations

import numpy as np

from tinyt.config import ModelConfig
from tinyt.contract import DECODER_WITH_PAST, kv_shape, past_name, past_names


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
