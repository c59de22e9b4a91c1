"""What a shared-cache pair's two graphs each cost in greedy agreement with fp32: the pair as
the runtime plans it (prompts through its prompt graph, steps as the tuner chose), and its step
graph alone (the prompts through it too), on the peer benchmark's agreement prompts.

    .venv/bin/python -m lab.pair_agreement ARTIFACTS --pair onnx-int8-gqa --prompts 8 \
        --out results.json

ARTIFACTS holds onnx-opt (the fp32 reference) and onnx-int8 (whose --data the prompts come
from), as for benchmarks.peers. One thread; prints and writes the agreements (position by
position, as benchmarks.peers counts them) and the plan.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import tinyt.runtime as rt
from tinyt.benchmarks.peers.measure import _inputs
from tinyt.runtime.cache import SharedCache


def step_graph_greedy(lm, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after ids, the prompt and every step through lm's step graph."""
    cache = SharedCache(lm.session, lm.config, 1, len(ids) + n + 1, prefill_session=None)
    logits, out = cache.prefill([ids], 0), []
    for _ in range(n):
        out.append(int(logits[0, 0, :lm.config.vocab_size].argmax()))
        logits = cache.step(np.array([out[-1]]), np.array([True]))
    return out


def agreement(ref: list[list[int]], got: list[list[int]]) -> float:
    pairs = [(a, b) for r, g in zip(ref, got, strict=True) for a, b in zip(r, g, strict=True)]
    return sum(a == b for a, b in pairs) / len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", type=Path)
    ap.add_argument("--pair", default="onnx-int8-gqa", help="the pair's directory in ARTIFACTS")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    fp32 = rt.load(args.artifacts / "onnx-opt", threads=1)
    plan = _inputs(args.artifacts, fp32.config, args.prompts, args.tokens)
    prompts, n = plan["agree_prompts"], plan["agree_new"]

    def greedy(lm) -> list[list[int]]:
        return [lm.generate_ids([p], max_new_tokens=n, min_new_tokens=n)[0].token_ids
                for p in prompts]

    ref = greedy(fp32)
    del fp32
    pair = rt.load(args.artifacts / args.pair, threads=1)
    if pair.plan is None:
        raise SystemExit(f"{args.pair} is not a shared-cache artifact (no plan)")
    result = {"pair": args.pair, "prompts": len(prompts), "prompt_tokens": len(prompts[0]),
              "new_tokens": n, "plan": pair.plan.describe(),
              "as_planned": agreement(ref, greedy(pair)),
              "step_graph_alone": agreement(ref, [step_graph_greedy(pair, p, n)
                                                  for p in prompts])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{args.pair}: greedy agreement with fp32, {len(prompts)} prompts x {n} tokens: "
          f"as planned {result['as_planned']:.1%}, step graph alone "
          f"{result['step_graph_alone']:.1%} ({result['plan']})")


if __name__ == "__main__":
    main()
