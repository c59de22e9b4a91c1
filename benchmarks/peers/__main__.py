"""python -m tinyt.benchmarks.peers ARTIFACTS [--out DIR] ...: the peer benchmark from the
command line; with --worker NAME, one engine's worker process (worker.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .engines import ENGINES
from .measure import run
from .worker import worker


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tinyt.benchmarks.peers",
                                 description="tinyt against the engines a user would pick "
                                             "instead, on the same weights.")
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/peers"))
    ap.add_argument("--rounds", type=int, default=8, help="0: greedy agreement only, no timing")
    ap.add_argument("--threads", type=int, action="append")
    ap.add_argument("--engine", action="append", help=f"one of {', '.join(ENGINES)} (repeat)")
    ap.add_argument("--agreement-prompts", type=int, default=32,
                    help="held-out prompts for the greedy agreement (64 new tokens each)")
    ap.add_argument("--long-context", type=int, metavar="N",
                    help="also decode with the context filled to N tokens (peak RSS with it)")
    ap.add_argument("--block", type=int, default=3, help="timed calls per call and round")
    ap.add_argument("--settle", type=int, default=1,
                    help="untimed calls before them (warm caches, spun-up threads)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--context", type=int, help=argparse.SUPPRESS)  # a worker's longest call
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.artifacts, args.threads[0], args.context)
    try:
        run(args.artifacts, args.out, threads=args.threads, rounds=args.rounds,
            engines=args.engine, agreement_prompts=args.agreement_prompts,
            long_context=args.long_context, block=args.block, settle=args.settle)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print((args.out / "peers.md").read_text())


if __name__ == "__main__":
    main()
