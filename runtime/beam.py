"""Beam search with transformers' semantics (torch-free), over any model that steps a set of
rows through a cache: a step function in, token ids out.

    first logits [B, V] ──log_softmax, rules, + each beam's score──▶ the best 2K of each source
         ▲                          │ an eos among the best K: a finished hypothesis, scored
         │                          │ sum_logprobs / generated_len ** length_penalty
         └── step(parents, tokens) ◀┘ the best K without eos run on (parents: which row each
                                        continues, so the caller reorders its cache)

As transformers 4.57's `_beam_search`: each source keeps the top num_beams x max(2, 1 + eos
ids) continuations of all its beams; those among the first num_beams that end in an eos (or
reach max_new_tokens) become finished hypotheses, the best num_beams of the rest run on.
A source stops when early_stopping is True and it holds num_beams finished hypotheses, or when
its best running beam cannot beat the worst of them (early_stopping False: at the length it
has now; "never" with length_penalty > 0: at max_new_tokens). Its answer is its best finished
hypothesis. Log-probabilities add up in float32, as there.

One difference, where it cannot change an answer: transformers starts each source with one
real beam and num_beams - 1 copies at -1e9, and fills a step with fewer than 2K allowed tokens
from those; here a source simply has fewer beams until it has enough candidates.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tinyt.errors import ConfigError

from .rules import StepRules
from .sampling import nonfinite_error

# step(parents [R] int64, tokens [R] int64) -> logits [R, V]: row i continues row parents[i]
# of the previous call (of the first logits, at the first step) with token tokens[i].
StepFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
EARLY_STOPPING = (False, True, "never")


class TopFn(Protocol):
    """A step's best continuations a row (runtime/heads.BeamHead)."""

    def __call__(self, logits: np.ndarray, k: int, mask: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Each row's k best log-probabilities [R, k] of logits [R, V] (after the mask's
        0 / -inf), best first, and their ids."""
        ...

    def top(self, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's k largest scores [R, k] (log-probabilities already ruled), best first,
        and their ids."""
        ...


@dataclass(frozen=True)
class BeamParams:
    """A beam search's settings, checked."""
    num_beams: int
    length_penalty: float = 1.0  # > 0 favours longer hypotheses, < 0 shorter
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        k = self.num_beams
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
            raise ConfigError(f"num_beams={k!r} is invalid: an integer >= 1 (1 = no beam "
                              "search)")
        p = self.length_penalty
        if not (isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p)):
            raise ConfigError(f"length_penalty={p!r} is invalid: a finite number (1.0: the "
                              "mean log-probability; 0: the sum)")
        if not any(self.early_stopping is e if isinstance(e, bool) else self.early_stopping == e
                   for e in EARLY_STOPPING):
            raise ConfigError(f"early_stopping={self.early_stopping!r} is invalid: True, False "
                              "or 'never'")


@dataclass
class _Source:
    """One source's search: its running beams (row tokens, scores) and finished hypotheses
    (score, tokens, whether an eos ended it), best first."""
    prefix: list[int]
    beams: list[list[int]]
    scores: list[float]
    finished: list[tuple[float, list[int], bool]]
    done: bool = False


def beam_search(first: np.ndarray, step: StepFn, prefixes: Sequence[Sequence[int]],
                params: BeamParams, *, eos: Sequence[int], max_new_tokens: int,
                rules: StepRules | None = None, head: TopFn | None = None
                ) -> list[tuple[list[int], str]]:
    """Each source's best hypothesis: its generated tokens (the eos that ended it left out)
    and why it ended ('eos' or 'length'). first: the logits [B, V] of each source's one row
    (the prompt's last position, or the decoder's start token); prefixes: each source's
    tokens before the generated ones (for the rules' n-grams); step: see StepFn; head: each
    row's best log-probabilities (runtime/heads.BeamHead), read from the logits at the steps
    no rule touches or whose rules are one mask for every row (rules.static_mask); else
    numpy's log_softmax and rules.apply make them, and head.top picks each row's best (no
    head: numpy's argpartition over all of a source's rows)."""
    K, eos_ids = params.num_beams, frozenset(int(e) for e in eos)
    if max_new_tokens == 0:
        return [([], "length") for _ in prefixes]
    keep = max(2, 1 + len(eos_ids)) * K
    srcs = [_Source(list(p), [[]], [0.0], []) for p in prefixes]
    rows = list(range(len(srcs)))  # the source of each row of `logits`
    logits, made = first, 0
    while made < max_new_tokens:
        ruled = rules is not None and rules.active
        mask = None
        if rules is not None and ruled and head is not None:
            mask = rules.static_mask(made, logits.shape[-1])
        if head is not None and (not ruled or mask is not None):
            logp, ids = head(logits, keep, mask)
            if not np.isfinite(logp[:, 0]).all():  # a NaN or inf makes its row's all NaN
                _check_finite(logits)
        else:
            _check_finite(logits)
            logp, ids = _log_softmax(logits), None
            if rules is not None and ruled:
                rules.apply(logp, [srcs[s].prefix + srcs[s].beams[i]
                                   for s, i in _row_beams(rows)], made)
            if head is not None:  # a source's best `keep` are among its rows' own best `keep`
                logp, ids = head.top(logp, keep)
        parents: list[int] = []
        tokens: list[int] = []
        next_rows: list[int] = []
        starts = _starts(rows)
        for s, (a, b) in starts.items():
            src = srcs[s]
            cand = logp[a:b] + np.asarray(src.scores, dtype=np.float32)[:, None]
            best = _best(cand, None if ids is None else ids[a:b], keep, made)
            _advance(src, best, a, params, eos_ids, made, max_new_tokens, parents, tokens)
            next_rows += [s] * (len(parents) - len(next_rows))
        made += 1
        if made >= max_new_tokens or not parents:
            break
        rows = next_rows
        logits = step(np.asarray(parents, dtype=np.int64), np.asarray(tokens, dtype=np.int64))
    return [(hyp, "eos" if by_eos else "length")
            for _, hyp, by_eos in (src.finished[0] for src in srcs)]


def _check_finite(logits: np.ndarray) -> None:
    peak = logits.max(axis=-1)
    if not np.isfinite(peak).all():
        raise nonfinite_error(peak[~np.isfinite(peak)][0])


def _best(cand: np.ndarray, ids: np.ndarray | None, keep: int, made: int
          ) -> list[tuple[int, int, float]]:
    """A source's best `keep` continuations (beam, token, accumulated log-probability), best
    first, of cand [beams, V] (ids None) or of each beam's best: cand [beams, k] with their
    token ids [beams, k]."""
    width = cand.shape[1]
    flat = cand.ravel()
    finite = int(np.isfinite(flat).sum())
    if finite == 0:
        raise ConfigError(f"no token is allowed at new token {made + 1}: no_repeat_ngram_size "
                          "or the banned words rule out the whole vocabulary")
    n = min(keep, finite)
    top = np.argpartition(-flat, n - 1)[:n] if n < flat.size else np.arange(flat.size)
    top = top[np.argsort(-flat[top], kind="stable")][:n]
    toks = top % width if ids is None else ids.ravel()[top]
    return list(zip((top // width).tolist(), toks.tolist(), flat[top].tolist()))


def _advance(src: _Source, best: list[tuple[int, int, float]], first_row: int,
             params: BeamParams, eos_ids: frozenset[int], made: int, max_new_tokens: int,
             parents: list[int], tokens: list[int]) -> None:
    """One step of one source: its best continuations (_best) become finished hypotheses and
    the next beams (appended to parents / tokens as rows)."""
    K = params.num_beams
    last = made + 1 >= max_new_tokens
    beams: list[list[int]] = []
    scores: list[float] = []
    for rank, (beam, tok, score) in enumerate(best):
        if tok in eos_ids or last:
            if rank < K:  # (a source that may add none has left: _done)
                length = made + 1  # the tokens generated, the eos included
                src.finished.append((score / length ** params.length_penalty,
                                     src.beams[beam] + ([] if tok in eos_ids else [tok]),
                                     tok in eos_ids))
        elif len(beams) < K:
            beams.append(src.beams[beam] + [tok])
            scores.append(score)
            parents.append(first_row + beam)
            tokens.append(tok)
    src.finished.sort(key=lambda f: -f[0])  # stable: an earlier hypothesis wins a tie
    del src.finished[K:]
    src.beams, src.scores = beams, scores
    src.done = _done(src, params, made + 1, max_new_tokens)
    if src.done:  # its rows leave the batch
        del parents[len(parents) - len(beams):], tokens[len(tokens) - len(beams):]


def _done(src: _Source, params: BeamParams, made: int, max_new_tokens: int) -> bool:
    """transformers' stopping rule for one source after a step that made `made` tokens."""
    K = params.num_beams
    full = len(src.finished) == K
    if not src.beams or (full and params.early_stopping is True):
        return True
    if not full:
        return False
    lp = params.length_penalty
    length = max_new_tokens if params.early_stopping == "never" and lp > 0 else made
    best_possible = src.scores[0] / length ** lp
    return not best_possible > src.finished[-1][0]


def _starts(rows: list[int]) -> dict[int, tuple[int, int]]:
    """Each source's rows [a, b) in `rows` (a source's rows are consecutive)."""
    out: dict[int, tuple[int, int]] = {}
    for r, s in enumerate(rows):
        a, _ = out.get(s, (r, r))
        out[s] = (a, r + 1)
    return out


def _row_beams(rows: list[int]) -> list[tuple[int, int]]:
    """(source, beam index within the source) of each row."""
    seen: dict[int, int] = {}
    out = []
    for s in rows:
        out.append((s, seen.get(s, 0)))
        seen[s] = seen.get(s, 0) + 1
    return out


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """log_softmax over the last axis, in float32 (a new array)."""
    z = logits.astype(np.float32, copy=True)
    z -= z.max(axis=-1, keepdims=True)
    z -= np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return z
