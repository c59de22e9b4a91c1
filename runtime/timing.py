"""The one interleaved timing loop, and the latency of ONNX graphs built on it (torch-free;
used by the benchmarks and by the quantize search). Machines are noisy: every measurement
here interleaves its candidates round by round, so a slow moment slows them all alike, and
reports medians."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


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
    from .session import graph_session

    sessions = {k: graph_session(p, level="all", threads=threads) for k, p in paths.items()}

    def run(session) -> Callable[[], Any]:
        return lambda: session.run(None, feeds)

    closures = {k: run(s) for k, s in sessions.items()}
    times = measure(closures, rounds=rounds, warmup=max(rounds // 10, 1))
    return median_ms(times)
