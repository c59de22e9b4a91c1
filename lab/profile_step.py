"""One decode step of two graphs side by side, per operator type, from ONNX Runtime's profiler:
tinyt's shared-cache step graph (first: its artifact's config gives the head size) and any
other decoder graph of the same model (GenAI's builder's, whose inputs are input_ids,
attention_mask and a past of fixed length), with the cache at the same past. A graph whose
attention is GroupQueryAttention runs as both runtimes run it: its past and present bound to
one buffer of `--capacity` tokens (tinyt's runtime allocates the next power of two of the
prompt and new tokens, GenAI its max_length), so that the kernel writes the new token in place
instead of copying the past every step; another graph gets its past and makes its present.

    .venv/bin/python -m lab.profile_step artifacts-smollm/onnx-int4-gqa/model.onnx \
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
import onnx
import onnxruntime as ort

from tinyt.contract import WINDOW_CAPACITY, WINDOW_INPUTS, kv_shape, window_slack
from tinyt.runtime.cache import window_capacity

FILL = {"input_ids": 1, "position_ids": None, "attention_mask": 1, "seqlens_k": None,
        "total_sequence_length": None, "query_seqlens": 1}


def feeds_for(session: ort.InferenceSession, past: int, cfg,
              capacity: int | None = None) -> dict[str, np.ndarray]:
    """Feeds of one step after `past` tokens, from the graph's own input list: a cache of
    kv_shape(cfg, 1, capacity) where the past and present share a buffer (capacity), else of
    `past` tokens. tinyt's windowed layers with buffers of their own (runtime/cache.py) get
    them at window_capacity, holding min(past, window + slack / 2) tokens: the runtime's mean
    between two moves of the window."""
    out = {}
    wpast = past if cfg.sliding_window is None else \
        min(past, cfg.sliding_window + window_slack(cfg.sliding_window) // 2)
    for i in session.get_inputs():
        dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32,
                 "tensor(int8)": np.int8}.get(i.type, np.float32)  # int8: an 8-bit KV cache
        if i.name.startswith("past_key_values") and i.shape[2] == WINDOW_CAPACITY:
            out[i.name] = np.zeros(kv_shape(cfg, 1, window_capacity(cfg, capacity)), dtype)
        elif i.name == WINDOW_INPUTS[0]:
            out[i.name] = np.full([1], wpast, dtype)
        elif i.name == WINDOW_INPUTS[1]:
            out[i.name] = np.array(wpast + 1, dtype)
        elif i.name.startswith("past_key_values"):
            out[i.name] = np.zeros(kv_shape(cfg, 1, capacity or past), dtype)
        elif i.name == "attention_mask":
            out[i.name] = np.ones((1, past + 1), dtype)
        elif i.name in ("position_ids", "seqlens_k"):
            out[i.name] = np.full([1] * len(i.shape), past, dtype)
        elif i.name == "total_sequence_length":
            out[i.name] = np.array(past + 1, dtype)
        else:
            out[i.name] = np.full([1] * len(i.shape), FILL.get(i.name, 0), dtype)
    return out


def shares_buffers(path: Path) -> bool:
    """Whether the graph's attention is GroupQueryAttention (which writes the new token into
    a past buffer bound as its present too); read without the weights."""
    proto = onnx.load(str(path), load_external_data=False)
    return any(n.op_type == "GroupQueryAttention" for n in proto.graph.node)


def _binding(session: ort.InferenceSession, feeds: dict[str, np.ndarray], shared: bool):
    """The step's inputs bound; each present bound to its past's buffer where `shared`."""
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    for o in session.get_outputs():
        buf = feeds.get("past_key_values" + o.name[len("present"):]) if shared and \
            o.name.startswith("present") else None
        if buf is None:
            binding.bind_output(o.name, "cpu")
        else:
            binding.bind_output(o.name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
    return binding


def _shape_key(event: dict) -> str:
    """An event's op and its output shapes: `MatMulNBits -> [1,1,6144]`."""
    shapes = [",".join(map(str, next(iter(o.values()))))
              for o in event["args"].get("output_type_shape", [])]
    return f"{event['args']['op_name']} -> " + " ".join(f"[{x}]" for x in shapes)


def profile(path: Path, past: int, threads: int, runs: int, cfg,
            by_shape: bool = False, capacity: int | None = None) -> tuple[Counter, float]:
    shared = shares_buffers(path)
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, "prof")
        s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        feeds = feeds_for(s, past, cfg, (capacity or past + 1) if shared else None)
        binding = _binding(s, feeds, shared)
        for _ in range(20):
            s.run_with_iobinding(binding)
        t = time.perf_counter()
        for _ in range(runs):
            s.run_with_iobinding(binding)
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
    ap.add_argument("--capacity", type=int, default=None,
                    help="tokens of a shared past/present buffer (default past + 1)")
    ap.add_argument("--by-shape", action="store_true",
                    help="one line per op type and output shape (which matmul costs what)")
    args = ap.parse_args()
    from tinyt.manifest import read_model_config

    cfg, _ = read_model_config(args.graphs[0].parent)  # the first is tinyt's
    if not 0 <= args.past < cfg.block_size:
        raise SystemExit(f"error: --past {args.past} must be in 0..{cfg.block_size - 1} (the "
                         "model's block_size less one)")
    if args.capacity is not None and not args.past < args.capacity <= cfg.block_size:
        raise SystemExit(f"error: --capacity {args.capacity} must be in {args.past + 1}.."
                         f"{cfg.block_size} (room for the past and the new token, within the "
                         "model's block_size)")
    a, b = (profile(g, args.past, args.threads, args.runs, cfg, args.by_shape, args.capacity)
            for g in args.graphs)
    names = [f"{g.parent.name}/{g.name}" for g in args.graphs]
    print(f"one decode step after {args.past} tokens, {args.threads} thread(s), µs per step"
          + (f"; shared buffers of {args.capacity} tokens" if args.capacity else ""))
    print(f"| op | {names[0]} | {names[1]} |\n|---|---|---|")
    for op in sorted(set(a[0]) | set(b[0]), key=lambda o: -(a[0][o] + b[0][o])):
        print(f"| {op} | {a[0][op]:.0f} | {b[0][op]:.0f} |")
    print(f"| **sum of kernels** | {sum(a[0].values()):.0f} | {sum(b[0].values()):.0f} |")
    print(f"| **wall per step** | {a[1]:.0f} | {b[1]:.0f} |")


if __name__ == "__main__":
    main()
