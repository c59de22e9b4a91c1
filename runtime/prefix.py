"""Prompt-prefix reuse for the engine (torch-free): the keys and values of recent prompts (and of
finished sequences: a conversation's next turn resends them), kept within a memory budget, so
a request whose prompt starts with tokens already computed copies their rows instead of
computing them again (vLLM's automatic prefix caching, llama.cpp's cache_prompt).

    admitted prompt P ──match──▶ the kept sequence sharing P's longest prefix (L tokens, at
        most len(P) - 1: the last token must run, its logits choose the first new one)
      L >= MIN_REUSE: a 1-row cache ◀─copy L tokens' rows─ the kept one; the rest of P runs
                      through it (SharedCache.extend, as a prompt piece of chunked prefill)
      else:           P runs whole
    ──▶ its cache kept (keyed by P), least recently used first out past the budget

A kept sequence is a 1-row SharedCache of the model's pool, owned here until evicted. One
whose tokens begin another kept one is dropped (the longer serves every match it would). A
model whose windowed layers keep only their window (tinyt.contract.compact_window_layers)
reuses a kept sequence only whole: its windowed buffers hold the last tokens, not a prefix.
Outputs are those of computing the prompt whole: the rows run the same graph, a causal
model's first L positions do not depend on what follows them (tests/runtime/test_prefix.py).
"""
from __future__ import annotations

import collections

import numpy as np

from .cache import SharedCache

MIN_REUSE = 16  # tokens: a shorter shared prefix is computed (a copy and a second run cost more)


class PrefixStore:
    """Kept sequences' caches, least recently used first out beyond `budget` bytes."""

    def __init__(self, lm, budget: int, *, min_reuse: int = MIN_REUSE):
        self.lm, self.budget, self.min_reuse = lm, budget, min_reuse
        self._kept: collections.OrderedDict[tuple[int, ...], SharedCache] = \
            collections.OrderedDict()
        self.bytes = 0
        self.reused_tokens = 0  # tokens copied instead of computed, for /metrics
        self.hits = 0

    @staticmethod
    def _size(cache: SharedCache) -> int:
        return sum(b.nbytes for b in cache.kv)

    def match(self, ids: list[int]) -> tuple[SharedCache, int] | None:
        """The kept cache sharing the longest prefix with `ids` and its length (at most
        len(ids) - 1), or None below min_reuse tokens."""
        want = np.asarray(ids, dtype=np.int64)
        best: tuple[SharedCache, int] | None = None
        for tokens, cache in self._kept.items():
            n = min(len(tokens), len(ids) - 1)
            if n < self.min_reuse or (best is not None and n <= best[1]):
                continue
            same = np.asarray(tokens[:n], dtype=np.int64) == want[:n]
            length = n if same.all() else int(np.argmin(same))
            if cache.window_layers and length != len(tokens):
                continue  # its windowed buffers hold its last tokens: whole or not at all
            if length >= self.min_reuse and (best is None or length > best[1]):
                best = (cache, length)
        if best is not None:
            key = next(k for k, c in self._kept.items() if c is best[0])
            self._kept.move_to_end(key)  # recently used
        return best

    def fill(self, staging: SharedCache, kept: SharedCache, length: int) -> None:
        """`staging` (1 row, cleared) holds the first `length` tokens of `kept`."""
        if kept.window_layers:  # whole (match): the buffers as they are
            staging.copy_in(0, kept, 0)
        else:
            for mine, theirs in zip(staging.kv, kept.kv):
                mine[0, :, :length] = theirs[0, :, :length]
            staging.lens[0] = length
            staging.wlens[0] = 0
        self.reused_tokens += length
        self.hits += 1

    def keep(self, tokens: list[int], cache: SharedCache) -> None:
        """Own `cache` (1 row holding `tokens`), evicting the least recently used past the
        budget; one too large for the budget, or no longer than min_reuse, goes back to the
        pool."""
        key = tuple(tokens)
        size = self._size(cache)
        if len(key) < self.min_reuse or size > self.budget or key in self._kept:
            self.lm.give_cache(cache)
            return
        for other in [k for k in self._kept if len(k) <= len(key) and key[:len(k)] == k]:
            self._drop(other)  # a prefix of the new one: the new one serves its matches
        self._kept[key] = cache
        self.bytes += size
        while self.bytes > self.budget:
            self._drop(next(iter(self._kept)))

    def _drop(self, key: tuple[int, ...]) -> None:
        cache = self._kept.pop(key)
        self.bytes -= self._size(cache)
        self.lm.give_cache(cache)

    def clear(self) -> None:
        for key in list(self._kept):
            self._drop(key)

    def __len__(self) -> int:
        return len(self._kept)
