"""Where an encoder pass's time goes, per operator type, in several graphs of the same model
side by side, from ONNX Runtime's profiler: tinyt's optimized graph against Optimum's export of
the same weights, say (each graph as tinyt's runtime loads it: ONNX Runtime's level 'all',
without the fusions the runtime turns off, runtime/session.py UNFUSED).

    .venv/bin/python -m lab.profile_encoder tinyt=artifacts-st/onnx-opt/model.onnx \
        --optimum path/to/all-MiniLM-L6-v2 --batch 32 --tokens 128 --threads 1

(`--optimum DIR`: Optimum's own export of the transformers model in DIR, made into a temporary
directory and profiled as `optimum`; or give any graph as NAME=PATH.)

Every graph gets the same feeds, built from its own input list: random ids below `--vocab`,
a mask of ones (`--pad N`: the last N tokens of every other row padding), token types 0. The
graphs take turns, `--rounds` rounds of `--runs` runs each after one untimed run, so that the
machine's drift falls on all of them; prints each op type's milliseconds per run in each graph,
the summed kernel time, the wall time per run (model_run) and, at one thread (ONNX Runtime then
computes on the calling thread), the median CPU time of that thread per run: the least
disturbed by other processes on a shared machine, where the wall times stretch with the load.
A profile on a shared machine is provisional: it says where the time goes, not how fast either
graph is.
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

from lab.profile_step import _shape_key
from tinyt.runtime.session import UNFUSED


def feeds_for(session: ort.InferenceSession, batch: int, tokens: int, vocab: int,
              pad: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((batch, tokens), dtype=np.int64)
    mask[1::2, tokens - pad:] = 0
    made = {"input_ids": rng.integers(5, vocab, (batch, tokens), dtype=np.int64),
            "attention_mask": mask, "token_type_ids": np.zeros((batch, tokens), np.int64)}
    feeds = {}
    for i in session.get_inputs():
        if i.name not in made:
            raise SystemExit(f"error: {i.name!r} is not an input this profile feeds "
                             f"(it feeds {', '.join(made)})")
        feeds[i.name] = made[i.name].astype(np.int32 if i.type == "tensor(int32)" else np.int64)
    return feeds


class Profiled:
    """One graph's session with the profiler on, and what its runs have cost so far."""

    def __init__(self, path: Path, threads: int, level: str, tmp: str, name: str):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.graph_optimization_level = {
            "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(tmp, name)
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"],
                                            disabled_optimizers=UNFUSED)

    def trace(self) -> list[dict]:
        return json.loads(Path(self.session.end_profiling()).read_text())


def summarize(trace: list[dict], skip: int, by_shape: bool = False
              ) -> tuple[Counter, float, int]:
    """Microseconds per run of each op type (and output shape, by_shape) and of model_run,
    over the runs after `skip`."""
    runs = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    kept = runs[skip:]
    start = kept[0]["ts"] if kept else float("inf")
    per_op: Counter = Counter()
    for e in trace:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and \
                e["ts"] >= start:
            per_op[_shape_key(e) if by_shape else e["args"]["op_name"]] += e["dur"]
    n = max(len(kept), 1)
    return Counter({k: v / n for k, v in per_op.items()}), \
        sum(e["dur"] for e in kept) / n, len(kept)


def optimum_export(source: Path, out: Path) -> Path:
    """Optimum's ORTModelForFeatureExtraction export (export=True) of the model in `source`."""
    try:
        from optimum.onnxruntime import ORTModelForFeatureExtraction
    except ImportError as e:
        raise SystemExit(f"error: --optimum needs Optimum ({e}): pip install "
                         "'optimum[onnxruntime]', or bash scripts/setup-encoder-peers.sh and "
                         "run this with .venv-encoder-peers/bin/python") from e
    ORTModelForFeatureExtraction.from_pretrained(source, export=True).save_pretrained(out)
    return out / "model.onnx"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graphs", nargs="+", help="NAME=PATH of each model.onnx")
    ap.add_argument("--optimum", type=Path, help="a transformers model directory: profile "
                    "Optimum's export of it too, as 'optimum'")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--pad", type=int, default=0, help="padding at the end of every other row")
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--level", default="all", choices=("disabled", "extended", "all"))
    ap.add_argument("--by-shape", action="store_true",
                    help="one line per op type and output shape (attention's matmuls apart "
                    "from the projections')")
    args = ap.parse_args()
    if not 0 <= args.pad < args.tokens:
        raise SystemExit(f"error: --pad {args.pad} must be at least 0 and below --tokens")
    named = []
    for spec in args.graphs:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"error: {spec!r} is not NAME=PATH of a model.onnx")
        named.append((name, Path(path)))
    with tempfile.TemporaryDirectory() as tmp:
        if args.optimum is not None:
            named.append(("optimum", optimum_export(args.optimum, Path(tmp) / "optimum")))
        profiled = {n: Profiled(p, args.threads, args.level, tmp, n) for n, p in named}
        feeds = {n: feeds_for(s.session, args.batch, args.tokens, args.vocab, args.pad)
                 for n, s in profiled.items()}
        for n, s in profiled.items():  # one untimed run each: allocations, first touches
            s.session.run(None, feeds[n])
        cpu: dict[str, list[float]] = {n: [] for n in profiled}
        for _ in range(args.rounds):
            for n, s in profiled.items():
                for _ in range(args.runs):
                    start = time.thread_time()
                    s.session.run(None, feeds[n])
                    cpu[n].append(time.thread_time() - start)
        results = {n: summarize(s.trace(), skip=1, by_shape=args.by_shape)
                   for n, s in profiled.items()}
    names = [n for n, _ in named]
    ops = sorted({op for per_op, _, _ in results.values() for op in per_op},
                 key=lambda op: -max(results[n][0].get(op, 0.0) for n in names))
    print(f"batch {args.batch} x {args.tokens} tokens (padding {args.pad} in every other row), "
          f"{args.threads} thread(s), level {args.level}, {args.rounds} x {args.runs} runs; "
          "ms per run")
    print("| op type | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for op in ops:
        print(f"| {op} | " + " | ".join(  # — where the graph has no such op
            f"{results[n][0][op] / 1e3:.2f}" if op in results[n][0] else "—"
            for n in names) + " |")
    print("| **kernels** | " + " | ".join(f"{sum(results[n][0].values()) / 1e3:.2f}"
                                          for n in names) + " |")
    print("| **model_run** | " + " | ".join(f"{results[n][1] / 1e3:.2f}" for n in names) + " |")
    if args.threads == 1:
        print("| **thread CPU, median** | " + " | ".join(
            f"{1e3 * float(np.median(cpu[n])):.2f}" for n in names) + " |")


if __name__ == "__main__":
    main()
