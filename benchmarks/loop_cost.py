"""Where the generation loop's own time goes: tinyt's per-token time outside ONNX Runtime's run
calls, with warm caches and with the caches flushed after every run as a large model's step
flushes them (it streams all its weights through them).

    .venv/bin/python -m benchmarks.loop_cost artifacts/onnx-int8-gqa
    .venv/bin/python -m benchmarks.loop_cost artifacts/onnx-int8-gqa --flush-mb 92

Batch 1, greedy, 1 thread, 60 new tokens after a 64-token prompt; best of 7 generations after
one warm-up. `--flush-mb` (default: the size of the step graph, model.onnx and its external
data: what one decode step reads) is read after each run, inside
the timed run, so it counts as ONNX Runtime's time, not the loop's: what changes is only how
cold the loop's own code and data are when it gets the CPU back.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


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


def outside_run_us(artifact: Path, flush_mb: float, tokens: int = 60, prompt: int = 64) -> float:
    import tinyt.runtime as rt

    lm = rt.load(artifact, threads=1, tune=False)
    ids = [int(i) for i in np.arange(prompt) * 7919 % lm.tokenizer.vocab_size]
    return outside_run(lm, ids, tokens, flush_mb=flush_mb)["outside_run_us_per_token"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--flush-mb", type=float, default=None,
                    help="MB read after every run (default: the step graph's files)")
    args = ap.parse_args()
    flush = args.flush_mb if args.flush_mb is not None else sum(
        f.stat().st_size for f in args.artifact.glob("model.onnx*")) / 2**20
    warm, cold = outside_run_us(args.artifact, 0), outside_run_us(args.artifact, flush)
    print(f"{args.artifact}: loop outside run, µs/token: warm caches {warm:.1f}; "
          f"{flush:.0f} MB flushed after each run {cold:.1f}")


if __name__ == "__main__":
    main()
