"""Where the generation loop's own time goes: tinyt's per-token time outside ONNX Runtime's run
calls, with warm caches and with the caches flushed after every run as a large model's step
flushes them (it streams all its weights through them).

    .venv/bin/python -m lab.loop_cost artifacts/onnx-int8-gqa
    .venv/bin/python -m lab.loop_cost artifacts/onnx-int8-gqa --flush-mb 92

Batch 1, greedy, 1 thread, 60 new tokens after a 64-token prompt; best of 7 generations after
one warm-up. `--flush-mb` (default: the size of the step graph, model.onnx and its external
data: what one decode step reads) is read after each run, inside
the timed run, so it counts as ONNX Runtime's time, not the loop's: what changes is only how
cold the loop's own code and data are when it gets the CPU back.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tinyt.benchmarks.peers.worker import outside_run


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
