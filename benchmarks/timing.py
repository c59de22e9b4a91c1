"""The one interleaved timing loop, and the decode-step latency of ONNX graphs built on it
(torch-free). Machines are noisy: every measurement here interleaves its candidates round by
round, so a slow moment slows them all alike, and reports medians."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def measure(closures: dict[str, Callable[[], Any]], rounds: int, warmup: int, block: int = 1,
            settle: int = 0) -> dict[str, list[float]]:
    """Seconds per call of each closure: rounds interleaved across them, in each round
    `settle` untimed calls then `block` timed ones per closure (rounds * block samples)."""
    for fn in closures.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in closures}
    for _ in range(rounds):
        for name, fn in closures.items():
            for _ in range(settle):
                fn()
            for _ in range(block):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    return times


def median_ms(times: dict[str, list[float]]) -> dict[str, float]:
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def session_latency_ms(paths: dict[str, Any], feeds: dict, *, rounds: int,
                       threads: int = 2) -> dict[str, float]:
    """Median ms of session.run(feeds) per graph file (spinning off, `threads` threads), the
    first tenth of the rounds untimed."""
    from tinyt.runtime.session import graph_session

    sessions = {k: graph_session(p, level="all", threads=threads) for k, p in paths.items()}
    times = measure({k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()},
                    rounds=rounds, warmup=max(rounds // 10, 1))
    return median_ms(times)


def latency_ms(paths: dict[str, str], cfg, kind: str, *, rounds: int = 200,
               threads: int = 2) -> dict[str, float]:
    """Median ms of one decode step (batch 1, one new token, past block_size/2) per graph;
    for graphs without a cache, one forward of block_size/2 tokens."""
    import numpy as np

    from tinyt.export.compare import random_feeds

    past = cfg.block_size // 2
    rng = np.random.default_rng(0)
    feeds = (random_feeds(cfg, kind, 1, 1, past, 0, rng) if kind == "decoder_with_past"
             else random_feeds(cfg, kind, 1, past, 0, 0, rng))
    return session_latency_ms(paths, feeds, rounds=rounds, threads=threads)
