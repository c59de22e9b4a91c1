"""Beam search on a decoder-only LanguageModel (torch-free): the step functions runtime/beam.py
drives, one for each way a decoder graph keeps its cache.

    prompts ──prefill──▶ last logits ──beam_search──▶ step(parents, tokens): each row's cache
                                                       copied from its parent's, then one step

    contract graph (past / present)  the presents gathered by parent, the mask with them
    shared-cache graph               the prompts run in a staging cache and copied into a cache
                                     of B x num_beams rows; a step copies rows by parent in
                                     place, then runs the rows it holds (step_rows)
    no-cache graph                   every row's whole sequence runs again

A graph pinned to fixed shapes has no room for the beams: refused by name.
"""
from __future__ import annotations

import numpy as np

from tinyt.contract import DECODER, DECODER_WITH_PAST, SHARED_CACHE_KIND, past_name
from tinyt.errors import ConfigError

from .beam import BeamParams, StepFn, beam_search
from .feeds import left_pad, prefill_feeds
from .rules import Rules

BEAM_KEYWORDS = ("num_beams", "length_penalty", "early_stopping", "no_repeat_ngram_size")
# what beam search here does not combine with, and the value that leaves each out
NOT_WITH_BEAMS = {"temperature": 0, "top_k": None, "top_p": None, "repetition_penalty": 1.0,
                  "stop": (), "min_new_tokens": 0}


def beam_settings(kwargs: dict) -> tuple[BeamParams, int] | None:
    """Pop generate's beam keywords from `kwargs`: (BeamParams, no_repeat_ngram_size) for
    num_beams > 1, None for the other loops; ConfigError for beam settings without beams,
    or beams with settings they do not take (sampling, stop strings, ...)."""
    given = {k: kwargs.pop(k) for k in BEAM_KEYWORDS if k in kwargs}
    params = BeamParams(given.get("num_beams", 1), given.get("length_penalty", 1.0),
                        given.get("early_stopping", False))
    ngram = given.get("no_repeat_ngram_size", 0)
    Rules(max_new_tokens=1, no_repeat_ngram_size=ngram)  # checks it
    if params.num_beams == 1:
        extra = sorted(k for k in given if k != "num_beams")
        if extra:
            raise ConfigError(f"{', '.join(extra)} apply to beam search: give num_beams > 1 "
                              "as well, or leave them out")
        return None
    for key in ("json_schema", "logprobs"):
        if kwargs.get(key) is not None:
            raise ConfigError(f"{key} does not combine with num_beams={params.num_beams}: "
                              "beam search here chooses from the model's own distribution")
    bad = sorted(k for k, off in NOT_WITH_BEAMS.items() if k in kwargs and kwargs[k] != off
                 and not (k == "stop" and not kwargs[k]))
    if bad:
        raise ConfigError(f"num_beams={params.num_beams} does not combine with "
                          f"{', '.join(f'{k}={kwargs[k]!r}' for k in bad)}: beam search here is "
                          "deterministic and ends at the end-of-text token or max_new_tokens")
    return params, ngram


def lm_beam_search(lm, rows: list[list[int]], max_new_tokens: int, params: BeamParams,
                   ngram: int) -> list[tuple[list[int], str]]:
    """Each prompt's best hypothesis (tokens, finish reason: eos, length, or context where
    the longest prompt leaves less room than max_new_tokens) on `lm`, a LanguageModel."""
    room = min(max_new_tokens, lm.context - max(map(len, rows)))
    kind = lm.artifact.kind
    if lm.artifact.fixed is not None or kind not in (DECODER_WITH_PAST, SHARED_CACHE_KIND,
                                                     DECODER):
        raise ConfigError(f"{lm.artifact.path} is pinned to fixed shapes (or its graph kind "
                          f"{kind!r} has no decode steps): beam search needs a dynamic-shape "
                          "decoder artifact")
    make = {DECODER_WITH_PAST: _contract_steps, SHARED_CACHE_KIND: _shared_steps,
            DECODER: _rerun_steps}[kind]
    first, step = make(lm, rows, params.num_beams, room)
    eos = [] if lm.tokenizer.eos_id is None else [lm.tokenizer.eos_id]
    out = beam_search(first, step, rows, params, eos=eos, max_new_tokens=room,
                      rules=Rules(max_new_tokens=room, no_repeat_ngram_size=ngram),
                      head=lm.beam_head)
    return [(ids, "context" if reason == "length" and room < max_new_tokens else reason)
            for ids, reason in out]


Made = tuple[np.ndarray, StepFn]  # the prompts' last logits, the step function


def _choosable(lm, logits: np.ndarray) -> np.ndarray:
    """Logits [R, V] cut to the tokenizer's ids (a padded vocabulary's extra ids are never
    chosen, as in LanguageModel's loops)."""
    V = lm.tokenizer.vocab_size
    return logits[:, :V] if V < lm.config.vocab_size else logits


def _contract_steps(lm, rows: list[list[int]], K: int, room: int) -> Made:
    """Past / present with numpy feeds: a step gathers the presents and the mask by parent."""
    session = lm.session
    names = [o.name for o in session.get_outputs()]  # logits, presents
    pasts = [past_name(n) for n in names[1:]]
    ids, mask = left_pad(rows, lm.pad_id)
    out = session.run(names, prefill_feeds(lm.config, DECODER_WITH_PAST, ids, mask,
                                           kv_dtype=lm.kv_dtype))
    state = {"kv": out[1:], "mask": mask}

    def step(parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        mask = state["mask"][parents]
        mask = np.concatenate([mask, np.ones((len(parents), 1), dtype=np.int64)], axis=1)
        feeds = {name: kv[parents] for name, kv in zip(pasts, state["kv"])}
        feeds.update(input_ids=tokens[:, None], attention_mask=mask,
                     position_ids=mask.sum(-1, keepdims=True) - 1)
        out = session.run(names, feeds)
        state.update(kv=out[1:], mask=mask)
        return _choosable(lm, out[0][:, -1])

    return _choosable(lm, out[0][:, -1]), step


def _shared_steps(lm, rows: list[list[int]], K: int, room: int) -> Made:
    """The shared cache: the prompts run once, in a staging cache of B rows, and are copied
    into a cache of B x K rows; a step copies each row's keys, values and lengths from its
    parent's (in place), then runs the first R rows."""
    B, reach = len(rows), max(map(len, rows)) + room
    # a cache of its own, not the pool's: step_rows leaves its binding at R rows
    cache = lm.new_cache(B * K, reach, lower="the prompts, their length, num_beams or "
                         "max_new_tokens")
    staging = lm.take_cache(B, reach)
    try:
        cache.clear()
        staging.clear()
        logits = cache.admit_from(dict(enumerate(rows)), lm.pad_id, staging)
    finally:
        lm.give_cache(staging)
    first = _choosable(lm, np.stack([logits[r] for r in range(B)]))

    def step(parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        R = len(parents)
        if (parents != np.arange(R)).any():
            for buf in cache.kv:
                buf[:R] = buf[parents]
            cache.lens[:R], cache.wlens[:R] = cache.lens[parents], cache.wlens[parents]
        return _choosable(lm, cache.step_rows(R, tokens, np.ones(R, dtype=bool)))

    return first, step


def _rerun_steps(lm, rows: list[list[int]], K: int, room: int) -> Made:
    """A graph without a cache: each row's whole sequence, left-padded, runs again."""
    state = {"seqs": [list(r) for r in rows]}

    def run() -> np.ndarray:
        ids, mask = left_pad(state["seqs"], lm.pad_id)
        (logits,) = lm.session.run(["logits"], prefill_feeds(lm.config, DECODER, ids, mask))
        return _choosable(lm, logits[:, -1])

    def step(parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        state["seqs"] = [state["seqs"][p] + [int(t)] for p, t in zip(parents, tokens)]
        return run()

    return run(), step
