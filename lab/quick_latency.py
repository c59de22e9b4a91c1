"""Side-by-side latency of artifact directories (a quick check; the full harness is harness.py).

Decode: one new token with a past of 64 (batch 1); prefill: 128 tokens (batch 1); both capped
by the model's block_size. 2 intra-op
threads, spinning off, rounds interleaved across the graphs, medians after a 10% warm-up.

    .venv/bin/python -m lab.quick_latency artifacts/onnx artifacts/onnx-opt \
        artifacts/onnx-int8
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tinyt.contract import DECODER_WITH_PAST
from tinyt.export.compare import random_feeds
from tinyt.manifest import check_manifest, read_model_config
from tinyt.runtime.timing import session_latency_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    cfg, _ = read_model_config(args.dirs[0])
    kinds = {check_manifest(d)["graph"] for d in args.dirs}
    if kinds != {DECODER_WITH_PAST}:
        raise SystemExit(f"expects KV-cache decoder artifacts, got {kinds}")
    rng = np.random.default_rng(0)
    past, prompt = min(64, cfg.block_size - 1), min(128, cfg.block_size)  # demo: 64 and 128
    shapes = {f"decode_ms_past{past}": random_feeds(cfg, DECODER_WITH_PAST, 1, 1, past, 0, rng),
              f"prefill_ms_{prompt}": random_feeds(cfg, DECODER_WITH_PAST, 1, prompt, 0, 0,
                                                   rng)}
    paths = {str(d): Path(d) / "model.onnx" for d in args.dirs}
    result = {d: {"bytes": p.stat().st_size} for d, p in paths.items()}
    for label, feeds in shapes.items():
        rounds = args.rounds if "decode" in label else max(args.rounds // 5, 20)
        for d, ms in session_latency_ms(paths, feeds, rounds=rounds,
                                        threads=args.threads).items():
            result[d][label] = round(ms, 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
