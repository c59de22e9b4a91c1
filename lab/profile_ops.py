"""Where a decode step's (or a prompt pass's) time goes, per operator type, from ONNX Runtime's
profiler.

    .venv/bin/python -m lab.profile_ops artifacts/onnx-int8 artifacts/onnx-opt
    .venv/bin/python -m lab.profile_ops artifacts/onnx-opt --prefill 128

Batch 1; decode: one new token after a past of block_size - 1; --prefill N: N tokens, no
past. 2 threads, 300 runs after 30 warm-ups; prints each op type's share of the summed kernel
time and its microseconds per run.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tinyt.contract import DECODER_WITH_PAST
from tinyt.export.compare import random_feeds
from tinyt.manifest import read_model_config


def profile(path: Path, steps: int = 300, threads: int = 2,
            prefill: int = 0) -> tuple[Counter, float]:
    cfg, _ = read_model_config(path)
    if not 0 <= prefill <= cfg.block_size:
        raise SystemExit(f"error: --prefill {prefill} must be between 1 and the model's "
                         f"block_size {cfg.block_size}")
    new, past = (prefill, 0) if prefill else (1, cfg.block_size - 1)
    feeds = random_feeds(cfg, DECODER_WITH_PAST, 1, new, past, 0, np.random.default_rng(0))
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "prof")
        sess = ort.InferenceSession(str(path / "model.onnx"), opts,
                                    providers=["CPUExecutionProvider"])
        for _ in range(30 + steps):
            sess.run(None, feeds)
        trace = json.loads(Path(sess.end_profiling()).read_text())
    per_op: Counter = Counter()
    runs = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    for e in trace:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
    scale = (30 + steps) / steps  # the warm-up steps are in the trace too
    run_us = sum(e["dur"] for e in runs[30:]) / steps
    return Counter({k: v / scale / steps for k, v in per_op.items()}), run_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--prefill", type=int, default=0, help="profile an N-token prompt pass")
    args = ap.parse_args()
    for d in args.dirs:
        per_op, run_us = profile(d, prefill=args.prefill)
        total = sum(per_op.values())
        what = f"prefill {args.prefill}" if args.prefill else "decode step"
        print(f"\n{d}: {run_us:.0f} us per {what} (model_run), {total:.0f} us in kernels")
        for op, us in per_op.most_common(10):
            print(f"  {op:28s} {us:7.1f} us  {100 * us / total:5.1f}%")


if __name__ == "__main__":
    main()
