"""Side-by-side latency of artifact directories (a quick check; the full harness is harness.py).

Decode: one new token with a past of 64 (batch 1); prefill: 128 tokens (batch 1); both capped
by the model's block_size. 2 intra-op
threads, spinning off, rounds interleaved across the graphs, medians after a 10% warm-up.

    .venv/bin/python benchmarks/quick_latency.py artifacts/onnx artifacts/onnx-opt artifacts/onnx-int8
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tinyt.export.compare import random_feeds
from tinyt.manifest import check_manifest, read_model_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    cfg, _ = read_model_config(args.dirs[0])
    kinds = {check_manifest(d)["graph"] for d in args.dirs}
    if kinds != {"decoder_with_past"}:
        raise SystemExit(f"expects KV-cache decoder artifacts, got {kinds}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = {str(d): ort.InferenceSession(str(d / "model.onnx"), opts,
                                             providers=["CPUExecutionProvider"])
                for d in args.dirs}
    rng = np.random.default_rng(0)
    past, prompt = min(64, cfg.block_size - 1), min(128, cfg.block_size)  # demo: 64 and 128
    shapes = {f"decode_ms_past{past}": random_feeds(cfg, "decoder_with_past", 1, 1, past, 0, rng),
              f"prefill_ms_{prompt}": random_feeds(cfg, "decoder_with_past", 1, prompt, 0, 0,
                                                   rng)}
    result = {d: {"bytes": (Path(d) / "model.onnx").stat().st_size} for d in sessions}
    for label, feeds in shapes.items():
        rounds = args.rounds if "decode" in label else max(args.rounds // 5, 20)
        times = {d: [] for d in sessions}
        for _ in range(rounds):
            for d, sess in sessions.items():
                t = time.perf_counter()
                sess.run(None, feeds)
                times[d].append(time.perf_counter() - t)
        for d, v in times.items():
            result[d][label] = round(1e3 * statistics.median(v[rounds // 10:]), 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
