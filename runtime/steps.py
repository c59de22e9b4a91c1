"""The step coroutines behind LanguageModel.steps (torch-free): one for each way a decoder
graph runs a prompt and then one token at a time.

    steps = shared_steps(...)              # or fixed_ / rerun_ / cpu_ / bound_steps
    logits = next(steps)                   # the prompt pass: [B, S or 1, V]
    logits = steps.send((nxt, active))     # one step: nxt [B] int64, active [B] bool
    steps.close()                          # the buffers go back (a shared cache to its pool)

    shared_steps  the shared-cache graph: one KV buffer per layer, bound once (runtime/cache.py)
    fixed_steps   a graph pinned to fixed shapes: a window of fixed size (runtime/fixed.py)
    rerun_steps   a graph without a cache: the whole sequence runs again each step
    cpu_steps     past/present with numpy feeds, doing as little per step as it can
    bound_steps   past/present with I/O binding: the presents stay where the provider put them

Each does all its work inside the coroutine, nothing before the first next(): a call that
makes one and never runs it takes no buffers.
"""
from __future__ import annotations

from collections.abc import Generator

import numpy as np
import onnxruntime as ort

from tinyt.config import ModelConfig

from .cache import CachePool, capacity_for, rows_from_left_padded
from .feeds import grow_mask, step_feeds
from .fixed import FixedWindow

# Yields logits, is sent (next tokens [B] int64, which rows still run [B] bool).
Steps = Generator[np.ndarray, tuple[np.ndarray, np.ndarray], None]


def reach(feeds: dict[str, np.ndarray], new_tokens: int | None) -> int:
    """The tokens a call can reach: the prompt's and the most steps the caller will run (one
    where it does not say)."""
    T = feeds["input_ids"].shape[1]
    return T + (1 if new_tokens is None else new_tokens)


def shared_steps(caches: CachePool, feeds: dict[str, np.ndarray], new_tokens: int | None,
                 context: int, pad: int) -> Steps:
    """Steps on one shared cache taken from `caches` (sized for the call's reach, moved to one
    twice as long where a call runs past it); the cache goes back when the steps end."""
    B = feeds["input_ids"].shape[0]
    cache = caches.take(B, capacity_for(reach(feeds, new_tokens), context))
    try:
        logits = cache.prefill(rows_from_left_padded(feeds["input_ids"],
                                                     feeds["attention_mask"]), pad)
        while True:
            nxt, active = yield logits
            if cache.lens.max() >= cache.capacity and cache.capacity < context:
                # the next token has no room: the generation moves to a cache twice as long
                # (steps() was not told how far the call would go)
                bigger = caches.take(B, capacity_for(2 * cache.capacity, context))
                bigger.copy_from(cache)
                caches.give(cache)
                cache = bigger
            logits = cache.step(nxt, active)
    finally:  # the generation ended (or was abandoned): the buffers serve the next one
        caches.give(cache)


def fixed_steps(session: ort.InferenceSession, config: ModelConfig, kind: str, fixed: dict,
                feeds: dict[str, np.ndarray], kv_dtype: type[np.number]) -> Steps:
    """Steps on a graph pinned to fixed shapes: a window of fixed size (runtime/fixed.py)."""
    window = FixedWindow(session, config, kind, fixed, len(feeds["input_ids"]),
                         kv_dtype=kv_dtype)
    logits = window.feed(feeds["input_ids"], feeds["attention_mask"])
    while True:
        nxt, active = yield logits[:, None]
        logits = window.feed(nxt[:, None].astype(np.int64),
                             np.asarray(active, dtype=np.int64)[:, None])


def rerun_steps(session: ort.InferenceSession, names: list[str], kind: str,
                feeds: dict[str, np.ndarray]) -> Steps:
    """Steps on a graph without a cache: the whole sequence runs again each step."""
    while True:
        outputs = session.run(names, feeds)
        nxt, active = yield outputs[0]
        feeds = step_feeds(kind, feeds, nxt, names, outputs, active)


def cpu_steps(session: ort.InferenceSession, names: list[str], past_names: list[str],
              feeds: dict[str, np.ndarray], new_tokens: int | None, context: int) -> Steps:
    """The KV-cache loop with numpy feeds, doing as little per step as it can: the mask grows
    in a preallocated buffer (room for the call's reach, doubled when a call runs past it),
    positions count up in place (a finished row's stop: see grow_mask), and the presents
    become the next pasts as they are. `names`: the graph's outputs (logits, presents);
    `past_names`: the past input each present feeds."""
    B, T = feeds["attention_mask"].shape
    # A row may run to the context while a longer one finished: T + context bounds the
    # width; a call reaching `reach` tokens needs reach + 1.
    mask = np.zeros((B, min(max(reach(feeds, new_tokens), T) + 1, T + context + 1)),
                    dtype=np.int64)
    mask[:, :T] = feeds["attention_mask"]
    pos = feeds["position_ids"][:, -1:].copy()  # [B, 1]
    run, n = session.run, T
    while True:
        outputs = run(names, feeds)
        nxt, active = yield outputs[0]
        if n == mask.shape[1]:  # the call ran past what it said it would reach
            mask = np.concatenate([mask, np.zeros_like(mask)], axis=1)
        mask[:, n] = active
        n += 1
        pos += active[:, None]
        feeds = dict(zip(past_names, outputs[1:]))
        feeds["input_ids"] = nxt[:, None]
        feeds["attention_mask"] = mask[:, :n] if B == 1 else np.ascontiguousarray(mask[:, :n])
        feeds["position_ids"] = pos


def bound_steps(session: ort.InferenceSession, names: list[str], past_names: list[str],
                device: str, feeds: dict[str, np.ndarray]) -> Steps:
    """The KV-cache loop with I/O binding: present keys/values stay where the provider put
    them (device memory on CUDA) and become the next step's past without a round trip
    through numpy."""
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    mask = feeds["attention_mask"]
    while True:
        binding.bind_output("logits", "cpu")
        for name in names[1:]:
            binding.bind_output(name, device)
        session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        nxt, active = yield outputs[0].numpy()
        mask = grow_mask(mask, active)
        binding.bind_cpu_input("input_ids", nxt[:, None].astype(np.int64))
        binding.bind_cpu_input("attention_mask", mask)
        binding.bind_cpu_input("position_ids", np.clip(mask.sum(-1, keepdims=True) - 1, 0,
                                                       None))
        for past, value in zip(past_names, outputs[1:]):
            binding.bind_ortvalue_input(past, value)
