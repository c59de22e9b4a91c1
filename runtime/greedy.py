"""The commonest generation in a loop with nothing else in it (torch-free): one prompt, greedy,
no stop strings, a shared-cache graph (LanguageModel.generate_ids takes it where it applies).

    prompt ──prefill──▶ logits ──argmax (end-of-text masked until min_new_tokens)──▶ token
              ▲                                                                     │
              └──────────────────── one step on the same cache ◀────────────────────┘

A 4-layer model's step is ~80 us, so the loop's own time matters: 7.4 us a token here against
11.8 for the general loop (demo, 1 thread, lab/loop_cost.py; at the GPT-2 shape 51 against 78,
where the weights streamed each step evict the interpreter's code and data). Same rules as the
general loop (LanguageModel._choose).
"""
from __future__ import annotations

import math

import numpy as np

from tinyt.errors import NonFiniteError

from .cache import CachePool, capacity_for
from .sampling import SamplingParams, nonfinite_error


def greedy_one(caches: CachePool, row: list[int], params: SamplingParams, *, eos: int | None,
               limit: int | None, context: int, pad: int
               ) -> tuple[list[list[int]], list[str | None]]:
    """The general loop's tokens and finish reason for one prompt `row`, greedy, on a cache
    from `caches`. eos: end-of-text (None: the tokenizer has none); limit: the choosable ids
    (a padded vocabulary's extra ids never chosen; None: all); context: the model's; pad: the
    id fed where a row has no token."""
    out: list[int] = []
    if params.max_new_tokens == 0:
        return [out], ["length"]
    n_min = params.min_new_tokens
    room = min(params.max_new_tokens, context - len(row))  # tokens this call may add
    cache = caches.take(1, capacity_for(len(row) + room, context))
    try:
        logits, nxt, step = cache.prefill([row], pad), np.zeros(1, np.int64), cache.step
        while True:
            z = logits[0, 0] if limit is None else logits[0, 0, :limit]
            if eos is not None and len(out) < n_min:
                z[eos] = -np.inf  # end-of-text is not allowed yet
            tok = int(z.argmax())
            if not math.isfinite(z[tok]):
                raise stopped(len(out), 0, nonfinite_error(z[tok]))
            if tok == eos:
                return [out], ["eos"]
            out.append(tok)
            if len(out) >= room:
                return [out], ["length" if len(out) >= params.max_new_tokens else "context"]
            nxt[0] = tok
            logits = step(nxt, None)
    finally:
        caches.give(cache)


def stopped(made: int, row: int, error: NonFiniteError) -> NonFiniteError:
    """The error that ends a generation at non-finite logits, naming the token and row."""
    return NonFiniteError(f"generation stopped at new token {made + 1} of row {row}: {error}")
