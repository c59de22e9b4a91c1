"""A decoder engine's worker (protocol.py): one process per (engine, threads) loads its model
once, then answers JSON lines on stdin, so no engine's libraries, threads or caches share a
process with another's.

    parent                                         worker (python -m tinyt.benchmarks.peers
                                                           ARTIFACTS --worker NAME --threads N)
                                           ◀──     {"ready": true, "plan": ...} | {"error": ...}
    {"op": "greedy", "prompts", "n"}        ──▶    {"tokens": [[id, ...], ...]}
    {"op": "time", "calls", "settle",       ──▶    {"times": [[s, ...] per call]}: per call,
     "block"}                                        `settle` untimed runs, then `block` timed
                                                     (a call with "per_step": the seconds per
                                                     step inside the engine's loop, after the
                                                     first token, instead of the call's)
    {"op": "logprobs", "prompts", "vocab",  ──▶    {"saved": path}: next-token log-softmax,
     "path"}                                         [prompts, vocab] float32 .npy
    {"op": "outside_run", "ids", "n"}       ──▶    tinyt's time outside ONNX Runtime's runs
    {"op": "memory"}                        ──▶    {"rss": bytes, "peak_rss": bytes} of the
                                                     worker (Linux /proc; the hello carries
                                                     the same after the load, "loaded", and
                                                     whether the peak was then reset, so
                                                     that later it is the calls' own)
    (stdin closed)                                 exits

A failed request answers {"error": ..., "trace": ...}; the parent raises it as BenchError.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from tinyt.errors import BenchError

from .engines import engine
from .protocol import Worker, memory, reset_peak, serve, timed


def outside_run(lm, ids: list[int], n: int, *, flush_mb: float = 0.0,
                generations: int = 8) -> dict:
    """A loaded LanguageModel's time outside ONNX Runtime's run calls: generate's wall time
    minus the time inside session.run / run_with_iobinding (and the flush, if any), per
    generated token, best of `generations` - 1 after a warm-up. Its sessions are wrapped
    for the measurement and handed back after it."""
    junk = np.ones(int(flush_mb * 2**20) // 8) if flush_mb else None
    inside = [0.0]

    def timed(fn):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                if junk is not None:
                    junk.sum()  # stream flush_mb through the caches, as a large step does
                inside[0] += time.perf_counter() - t
        return call

    class Timed:  # a session, with its run calls timed
        def __init__(self, session):
            self.session = session
            self.run = timed(session.run)
            self.run_with_iobinding = timed(session.run_with_iobinding)

        def __getattr__(self, attr):
            return getattr(self.session, attr)

    session, prefill = lm.session, lm.prefill_session
    lm.session = Timed(session)
    if prefill is not None:  # a shared-cache pair: its prompt graph's runs too
        lm.prefill_session = Timed(prefill)
    if hasattr(lm, "_caches"):
        lm._caches.free.clear()  # caches bound to the unwrapped sessions
    runs = []
    try:
        for _ in range(generations):
            inside[0] = 0.0
            t = time.perf_counter()
            lm.generate_ids([ids], max_new_tokens=n, min_new_tokens=n, temperature=0)
            total = time.perf_counter() - t
            runs.append((total - inside[0], total, inside[0]))
    finally:  # the model as it was: its own sessions, no cache bound to the wrappers
        lm.session, lm.prefill_session = session, prefill
        if hasattr(lm, "_caches"):
            lm._caches.free.clear()
    outside, total, inside_s = min(runs[1:])
    return {"outside_run_us_per_token": 1e6 * outside / n, "total_ms": 1e3 * total,
            "inside_run_ms": 1e3 * inside_s, "tokens": n}


def _outside_run(gen, ids: list[int], n: int) -> dict:
    """tinyt's per-token time outside ONNX Runtime's run calls (lab/loop_cost.py),
    best of 5 generations, on the model the worker loaded (a second load would hold the
    weights twice: 11.6 GB for an fp32 1.2B model)."""
    if getattr(gen, "lm", None) is None:
        raise BenchError("outside_run measures tinyt's runtime; this worker's engine is not it")
    return outside_run(gen.lm, ids, n, generations=6)


def per_step(times: list[float], n: int) -> float:
    """Seconds per step from a generation's token times: from the first token (the prompt's
    pass) to the last, over the n - 1 steps between."""
    if n < 2 or len(times) != n:
        raise BenchError(f"a per-step timing needs n >= 2 tokens and their n times; got n={n}, "
                         f"{len(times)} times")
    return (times[-1] - times[0]) / (n - 1)


def _time_call(gen, call: dict, settle: int, block: int) -> list[float]:
    """`settle` untimed runs of the call, then `block` timed: the call's seconds, or with
    "per_step" the seconds per step inside the engine's loop (after the first token)."""
    if not call.get("per_step"):
        return timed(lambda: gen(call["ids"], call["n"]), settle, block)
    for _ in range(settle):
        gen(call["ids"], call["n"])
    return [per_step(gen.stepped(call["ids"], call["n"]), call["n"]) for _ in range(block)]


def _answer(req: dict, gen) -> dict:
    if req["op"] == "greedy":
        return {"tokens": [gen(p, req["n"]) for p in req["prompts"]]}
    if req["op"] == "time":
        return {"times": [_time_call(gen, call, req["settle"], req["block"])
                          for call in req["calls"]]}
    if req["op"] == "logprobs":  # next-token log-probabilities, to a .npy file
        rows = [np.asarray(gen.logits(p), dtype=np.float64) for p in req["prompts"]]
        z = np.stack(rows)[:, :req["vocab"]]  # an engine may pad its vocabulary
        z = z - z.max(-1, keepdims=True)
        np.save(req["path"], (z - np.log(np.exp(z).sum(-1, keepdims=True))).astype(np.float32))
        return {"saved": req["path"]}
    if req["op"] == "outside_run":
        return _outside_run(gen, req["ids"], req["n"])
    if req["op"] == "memory":
        return {"memory": memory()}
    return {"error": f"unknown op {req['op']!r}"}


def worker(name: str, artifacts: Path, threads: int, context: int | None = None) -> None:
    """Answer JSON requests on stdin, one per line, until stdin closes. `context`: the most
    tokens a call will hold (None: the model's block_size)."""
    def load():
        row = engine(name)
        gen = row.load(artifacts / row.artifact, artifacts, threads, context)
        loaded = memory()  # the load's resident set and its peak; then the calls' own peak
        return ({"ready": True, "plan": getattr(gen, "plan", None), "loaded": loaded,
                 "peak_reset": reset_peak()}, lambda req: _answer(req, gen))
    serve(load)


def start(name: str, artifacts: Path, threads: int, context: int | None = None) -> Worker:
    """The worker of engine `name` at `threads` (its hello read: .error where it could not
    load; .hello's "plan", "loaded", "peak_reset" where it did)."""
    return Worker(name, threads,
                  [sys.executable, "-m", "tinyt.benchmarks.peers", str(artifacts.resolve()),
                   "--worker", name, "--threads", str(threads)]
                  + ([] if context is None else ["--context", str(context)]),
                  {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
