"""Decode after a long context: tinyt's shared-cache graphs (a float32 or an 8-bit KV cache)
against llama.cpp with its f16 and q8_0 caches, on the same weights (issue 51).

    python -m lab.kv_long_decode ARTIFACTS OUT.json --context 4096 --threads 1 \
        --engine tinyt=onnx-int8-gqa --engine tinyt=kv8/onnx-int8-gqa \
        --engine llama.cpp-f16=peers/llama.cpp-q8_0 --engine llama.cpp-f16+fa=peers/llama.cpp-q8_0 \
        --engine llama.cpp-q8_0=peers/llama.cpp-q8_0

Each engine runs in its own process (python -m lab.kv_long_decode --worker ...), loads once
and answers `rounds` generations of `new` tokens after a prompt that fills the context to
`context` tokens; a step's time is the peer benchmark's decode_at_N: taken inside the engine's
own token loop (benchmarks/peers/adapters.py's stepped), (last token − first) / (new − 1), so
the prompt's pass stays out. The engines' processes alternate round by round. ARTIFACTS is a
peer benchmark's directory (onnx-opt's config, the checkpoint's tokenizer); a llama.cpp engine
names a directory holding model.gguf (benchmarks/peers/formats.gguf makes it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def prompt(artifacts: Path, length: int) -> list[int]:
    """`length` ids of held-out prose (pydoc topics) in the checkpoint's tokenizer."""
    from tinyt.benchmarks.real_quality import heldout_text
    from tinyt.checkpoint import load_checkpoint

    ids = load_checkpoint(artifacts / "checkpoint").tokenizer.encode(heldout_text())
    if len(ids) < length:
        raise ValueError(f"held-out prose is {len(ids)} tokens, fewer than {length}")
    return ids[:length]


def worker(spec: str, artifacts: Path, threads: int, context: int) -> None:
    """One engine: load, then per line on stdin (the prompt's ids and n) the seconds a step."""
    from tinyt.benchmarks.peers import adapters
    from tinyt.benchmarks.peers.worker import per_step

    kind, _, where = spec.partition("=")
    path = artifacts / where
    if kind == "tinyt":
        gen = adapters.tinyt(path, artifacts, threads, context)
    else:
        kv, fa = kind.split("-", 1)[1].partition("+fa")[:2]  # llama.cpp-q8_0, llama.cpp-f16+fa
        gen = adapters.llama_cpp(path, artifacts, threads, context, kv=kv,
                                 flash_attn=True if fa else None)
    print(json.dumps({"ready": getattr(gen, "plan", None)}), flush=True)
    for line in sys.stdin:
        ids, n = json.loads(line)
        print(json.dumps(per_step(gen.stepped(ids, n), n)), flush=True)


def run(artifacts: Path, engines: list[str], threads: int, context: int, new: int,
        rounds: int) -> dict:
    ids = prompt(artifacts, context - new)
    procs, plans = {}, {}
    for e in engines:  # one at a time: a tinyt load's peak (its tuner's sessions) is its own
        procs[e] = subprocess.Popen(
            [sys.executable, "-m", "lab.kv_long_decode", str(artifacts), "-", "--worker", e,
             "--threads", str(threads), "--context", str(context)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        plans[e] = json.loads(procs[e].stdout.readline())["ready"]
    times: dict[str, list[float]] = {e: [] for e in engines}
    for _ in range(rounds + 1):  # the first round settles (caches, threads), untimed
        for e, p in procs.items():
            p.stdin.write(json.dumps([ids, new]) + "\n")
            p.stdin.flush()
            times[e].append(json.loads(p.stdout.readline()))
    for p in procs.values():
        p.stdin.close()
        p.wait()
    return {"context": context, "new": new, "threads": threads, "rounds": rounds,
            "load_average": list(os.getloadavg()), "plans": plans,
            "ms_per_step": {e: [1e3 * t for t in ts[1:]] for e, ts in times.items()},
            "median_ms": {e: 1e3 * float(np.median(ts[1:])) for e, ts in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.kv_long_decode")
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--engine", action="append",
                    help="tinyt=DIR, or llama.cpp-KV=DIR: KV f16, f16+fa (flash attention) or "
                    "q8_0 (with it)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--new", type=int, default=16, help="tokens a timed generation")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.artifacts, args.threads, args.context)
    from tinyt.benchmarks.environment import environment

    result = {**environment(("tinyt", "onnxruntime", "llama-cpp-python")),
              **run(args.artifacts, args.engine, args.threads, args.context, args.new,
                    args.rounds)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["median_ms"], indent=1), f"load average {result['load_average']}")


if __name__ == "__main__":
    main()
