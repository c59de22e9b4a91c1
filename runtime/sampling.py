"""Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition penalty
(numpy only). Each sequence has its own random generator seeded by `seed`, so a prompt samples
the same tokens alone or inside a batch."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tinyt.errors import ConfigError, NonFiniteError

MAX_NEW_TOKENS_LIMIT = 1 << 20  # beyond this a request is a mistake, not a plan


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    min_new_tokens: int = 0  # the end-of-text token is not chosen before this many tokens
    temperature: float = 0.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the sequence
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        def bad(name, value, allowed):
            raise ConfigError(f"{name}={value!r} is invalid: {allowed}")

        n = self.max_new_tokens
        if not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_NEW_TOKENS_LIMIT):
            bad("max_new_tokens", n, f"an integer in 0..{MAX_NEW_TOKENS_LIMIT}")
        m = self.min_new_tokens
        if not (isinstance(m, int) and not isinstance(m, bool) and 0 <= m <= n):
            bad("min_new_tokens", m, f"an integer in 0..max_new_tokens ({n})")
        t = self.temperature
        if not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)
                and t >= 0):
            bad("temperature", t, "a finite number >= 0 (0 = greedy)")
        k = self.top_k
        if k is not None and not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
            bad("top_k", k, "None or an integer >= 1")
        p = self.top_p
        if p is not None and not (isinstance(p, (int, float)) and not isinstance(p, bool)
                                  and 0 < p <= 1):
            bad("top_p", p, "None or a number in (0, 1]")
        r = self.repetition_penalty
        if not (isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r)
                and r > 0):
            bad("repetition_penalty", r, "a finite number > 0 (1 = off)")
        if not (isinstance(self.stop, tuple) and all(isinstance(s, str) and s for s in self.stop)):
            bad("stop", self.stop, "a string or a list of non-empty strings")
        s = self.seed
        if s is not None and not (isinstance(s, int) and not isinstance(s, bool) and s >= 0):
            bad("seed", s, "None or an integer >= 0")


class Constraint(Protocol):
    """What a generation's tokens must follow (a grammar, a JSON schema: runtime/constrain.py),
    one object per sequence, asked before each token and told each token chosen."""

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits [vocab] of the tokens not allowed next to -inf, in place."""

    def accept(self, token: int) -> None:
        """The token chosen (one that mask allowed)."""

    @property
    def finished(self) -> bool:
        """Whether the tokens so far are a whole sentence of the grammar and nothing may
        follow but the end of the text."""


def next_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
               history: list[int]) -> int:
    """One token id from one row of logits [vocab]. Non-finite logits raise NonFiniteError:
    argmax returns the first NaN and max propagates it, so checking the one value that decides
    costs a scalar test per token, not a pass over the row (an isolated -inf among finite
    logits is allowed: it only rules a token out)."""
    if params.temperature == 0 and params.repetition_penalty == 1.0:
        tok = int(logits.argmax())  # greedy: no copy of the row per token
        if not math.isfinite(logits[tok]):
            raise nonfinite_error(logits[tok])
        return tok
    z = logits  # float32; float64 from here on only for what needs it (GPT-2's vocabulary:
    # top-k sampling went from 1.25 ms to 0.28 ms a token by not widening the whole row)
    if params.repetition_penalty != 1.0 and history:
        z = logits.astype(np.float64)
        seen = np.unique(np.asarray(history))
        z[seen] = np.where(z[seen] > 0, z[seen] / params.repetition_penalty,
                           z[seen] * params.repetition_penalty)
    top = z.max()
    if not math.isfinite(top):
        raise nonfinite_error(top)
    if params.temperature == 0:
        return int(z.argmax())
    ids = None  # the candidates: every id, or (top-k) the ids that can win, in id order
    if params.top_k is not None and params.top_k < z.size:
        kth = np.partition(z, -params.top_k)[-params.top_k]  # dividing by T keeps the order
        ids = np.flatnonzero(z >= kth)  # the rest would get probability 0: leave them out
        z = z[ids]
    z = z.astype(np.float64) / params.temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if params.top_p is not None and params.top_p < 1:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cum, params.top_p)) + 1]  # smallest set >= top_p
        mask = np.zeros_like(probs)
        mask[keep] = probs[keep]
        probs = mask / mask.sum()
    pick = min(int(np.searchsorted(np.cumsum(probs), rng.random(), side="right")),
               probs.size - 1)
    return pick if ids is None else int(ids[pick])


def nonfinite_error(value) -> NonFiniteError:
    """The error for a row of logits whose deciding value is NaN or infinite."""
    return NonFiniteError(f"the model's logits are not finite ({float(value)}): its weights or "
                          "the artifact are damaged; check it against its checkpoint with "
                          "'tinyt verify CHECKPOINT ARTIFACT'")
