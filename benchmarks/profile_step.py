"""One decode step of two graphs side by side, per operator type, from ONNX Runtime's profiler:
tinyt's shared-cache step graph (first: its artifact's config gives the head size) and any
other decoder graph of the same model (GenAI's builder's, whose inputs are input_ids,
attention_mask and a past of fixed length), with the cache at the same past.

    .venv/bin/python -m benchmarks.profile_step artifacts-smollm/onnx-int4-gqa/model.onnx \
        artifacts-smollm/peers/genai-builder-int4/model.onnx --past 94

Batch 1, one new token after `past` tokens, THREADS threads, 200 runs after 20 warm-ups,
one graph then the other; prints each op type's microseconds per step in each graph and the
wall time per step (--by-shape: per op type and output shape, e.g. each matmul's width).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tinyt.contract import CAPACITY, kv_shape

FILL = {"input_ids": 1, "position_ids": None, "attention_mask": 1, "seqlens_k": None,
        "total_sequence_length": None, "query_seqlens": 1}


def feeds_for(session: ort.InferenceSession, past: int, cfg) -> dict[str, np.ndarray]:
    """Feeds of one step after `past` tokens, from the graph's own input list: a cache of
    kv_shape(cfg, 1, past) (a shared buffer: past + 1)."""
    out = {}
    for i in session.get_inputs():
        dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}.get(i.type, np.float32)
        if i.name.startswith("past_key_values"):
            shared = i.shape[2] == CAPACITY
            out[i.name] = np.zeros(kv_shape(cfg, 1, past + 1 if shared else past), dtype)
        elif i.name == "attention_mask":
            out[i.name] = np.ones((1, past + 1), dtype)
        elif i.name in ("position_ids", "seqlens_k"):
            out[i.name] = np.full([1] * len(i.shape), past, dtype)
        elif i.name == "total_sequence_length":
            out[i.name] = np.array(past + 1, dtype)
        else:
            out[i.name] = np.full([1] * len(i.shape), FILL.get(i.name, 0), dtype)
    return out


def _shape_key(event: dict) -> str:
    """An event's op and its output shapes: `MatMulNBits -> [1,1,6144]`."""
    shapes = [",".join(map(str, next(iter(o.values()))))
              for o in event["args"].get("output_type_shape", [])]
    return f"{event['args']['op_name']} -> " + " ".join(f"[{x}]" for x in shapes)


def profile(path: Path, past: int, threads: int, runs: int, cfg,
            by_shape: bool = False) -> tuple[Counter, float]:
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "prof")
        s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        feeds = feeds_for(s, past, cfg)
        names = [o.name for o in s.get_outputs()]
        for _ in range(20):
            s.run(names, feeds)
        t = time.perf_counter()
        for _ in range(runs):
            s.run(names, feeds)
        wall = (time.perf_counter() - t) / runs
        events = json.loads(Path(s.end_profiling()).read_text())
    per_op: Counter = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[_shape_key(e) if by_shape else e["args"]["op_name"]] += e["dur"]
    n = runs + 20
    return Counter({k: v / n for k, v in per_op.items()}), wall * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", type=Path, nargs=2)
    ap.add_argument("--past", type=int, default=94)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--by-shape", action="store_true",
                    help="one line per op type and output shape (which matmul costs what)")
    args = ap.parse_args()
    from tinyt.manifest import read_model_config

    cfg, _ = read_model_config(args.graphs[0].parent)  # the first is tinyt's
    if not 0 <= args.past < cfg.block_size:
        raise SystemExit(f"error: --past {args.past} must be in 0..{cfg.block_size - 1} (the "
                         "model's block_size less one)")
    a, b = (profile(g, args.past, args.threads, args.runs, cfg, args.by_shape)
            for g in args.graphs)
    names = [f"{g.parent.name}/{g.name}" for g in args.graphs]
    print(f"one decode step after {args.past} tokens, {args.threads} thread(s), µs per step")
    print(f"| op | {names[0]} | {names[1]} |\n|---|---|---|")
    for op in sorted(set(a[0]) | set(b[0]), key=lambda o: -(a[0][o] + b[0][o])):
        print(f"| {op} | {a[0][op]:.0f} | {b[0][op]:.0f} |")
    print(f"| **sum of kernels** | {sum(a[0].values()):.0f} | {sum(b[0].values()):.0f} |")
    print(f"| **wall per step** | {a[1]:.0f} | {b[1]:.0f} |")


if __name__ == "__main__":
    main()
