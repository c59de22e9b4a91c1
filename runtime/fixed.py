"""Running a graph whose shapes are pinned (`tinyt package --fixed`), torch-free.

Accelerators that cannot take dynamic shapes get a graph with batch B, sequence S and past P
fixed. The same contract still generates text, with a window of P + S cache slots:

    past (P slots) + chunk (S slots) ─run─▶ present (P + S slots) ──keep P──▶ past
    mask: the slots' history (0 = empty or padding) + the chunk's (left-padded with 0s)

Tokens go in chunks of S, the first one left-padded; a decode step is a chunk of one token and
S - 1 padding slots. Empty slots are masked, so they never change a real token's output, and
positions count real tokens only. After each run the P slots kept are the real ones (in order)
topped up with empty ones: attention does not care where in the history a key sits, only
whether the mask shows it, so padding never uses up the window. A sequence may hold at most
`capacity` tokens: P + 1 with a cache; S without one, where every step runs the last S tokens
again.
"""
from __future__ import annotations

import numpy as np

from tinyt.config import ModelConfig
from tinyt.contract import DECODER_WITH_PAST, kv_shape, past_name, past_names
from tinyt.errors import ConfigError

AXES = ("batch_size", "sequence_length", "past_sequence_length")


def capacity(kind: str, fixed: dict[str, int]) -> int:
    """The most tokens (prompt + generated) a sequence can hold in this pinned graph."""
    if kind == DECODER_WITH_PAST:
        return fixed["past_sequence_length"] + 1
    return fixed["sequence_length"]


class FixedWindow:
    """Feeds token chunks of any length through a pinned graph; `feed` returns each row's
    logits at its last position, [rows, vocab]."""

    def __init__(self, session, cfg: ModelConfig, kind: str, fixed: dict[str, int], rows: int,
                 *, kv_dtype=np.float32):
        self.session, self.cfg, self.kind = session, cfg, kind
        self.B, self.S = fixed["batch_size"], fixed["sequence_length"]
        self.P = fixed.get("past_sequence_length", 0) if kind == DECODER_WITH_PAST else 0
        if rows > self.B:
            raise ConfigError(f"{rows} sequences, but this graph is pinned to batch_size "
                             f"{self.B}; give at most {self.B} at a time")
        self.rows = rows
        self.names = [o.name for o in session.get_outputs()]
        self.mask = np.zeros((self.B, self.P), dtype=np.int64)  # history of the cache slots
        self.overflow = False  # a real token had to leave the window: nothing more may run
        self.past = {name: np.zeros(kv_shape(cfg, self.B, self.P), dtype=kv_dtype)
                     for name in past_names(cfg.n_layer)}
        # no-cache graphs run the last S tokens of the history again at every step
        self.ids = np.zeros((self.B, 0), dtype=np.int64)
        self.hist = np.zeros((self.B, 0), dtype=np.int64)

    def feed(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """ids, mask [rows, n]: the next n slots of each row (mask 0 = padding)."""
        n = ids.shape[1]
        ids = np.pad(ids, ((0, self.B - self.rows), (0, 0)))  # unused rows: all padding
        mask = np.pad(mask, ((0, self.B - self.rows), (0, 0)))
        if self.kind != DECODER_WITH_PAST:
            return self._rerun(ids, mask)[: self.rows]
        lead = -n % self.S  # left-pad the first chunk so chunks are whole
        ids = np.pad(ids, ((0, 0), (lead, 0)))
        mask = np.pad(mask, ((0, 0), (lead, 0)))
        for start in range(0, ids.shape[1], self.S):
            logits = self._chunk(ids[:, start:start + self.S], mask[:, start:start + self.S])
        return logits[: self.rows]

    def _chunk(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        full = np.concatenate([self.mask, mask], axis=1)  # [B, P + S]
        if self.overflow:
            raise ConfigError(f"a sequence outgrew this pinned graph's window of "
                             f"{capacity(self.kind, self._fixed())} tokens")
        positions = self.mask.sum(-1, keepdims=True) + mask.cumsum(-1) - 1
        feeds = {"input_ids": ids, "attention_mask": full,
                 "position_ids": np.clip(positions, 0, None), **self.past}
        outputs = self.session.run(self.names, feeds)
        # keep P slots per row: empty ones first, then every real one, each group in order
        keep = np.argsort(full, axis=1, kind="stable")[:, full.shape[1] - self.P:]
        self.overflow = bool((full[: self.rows].sum(-1) > self.P).any())  # a real one dropped
        self.past = {past_name(name): np.take_along_axis(value, keep[:, None, :, None], axis=2)
                     for name, value in zip(self.names[1:], outputs[1:])}
        self.mask = np.take_along_axis(full, keep, axis=1)
        return outputs[0][:, -1]

    def _rerun(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.ids = np.concatenate([self.ids, ids], axis=1)
        self.hist = np.concatenate([self.hist, mask], axis=1)
        if self.hist[: self.rows, : -self.S].any():
            raise ConfigError(f"a sequence outgrew this pinned graph's window of {self.S} tokens")
        ids, mask = self.ids[:, -self.S:], self.hist[:, -self.S:]
        lead = self.S - ids.shape[1]
        feeds = {"input_ids": np.pad(ids, ((0, 0), (lead, 0))),
                 "attention_mask": np.pad(mask, ((0, 0), (lead, 0)))}
        return self.session.run(self.names[:1], feeds)[0][:, -1]

    def _fixed(self) -> dict[str, int]:
        return {"batch_size": self.B, "sequence_length": self.S, "past_sequence_length": self.P}
