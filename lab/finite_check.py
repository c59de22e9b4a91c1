"""What does the runtime's non-finite logits check cost per token? (Evidence for
runtime/sampling.next_token: it tests the one logit that decides, not the whole row; and its
top-k path, which no longer widens the whole row to float64.)

Three measurements, each interleaved (checked, unchecked, checked, ...) over ROUNDS rounds,
medians, with the CPU flags printed beside them:
1. next_token alone on one row of logits, greedy and sampled, at the demo's vocabulary (2048)
   and GPT-2's (50257);
2. a full-row check (np.isfinite(row).all()) for comparison, the design not taken;
3. decode ms/token of a real artifact through rt.load(...).generate, with next_token swapped
   for the unchecked version of before.

    .venv/bin/python lab/finite_check.py artifacts/onnx-int8-gqa
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import tinyt.runtime as rt
import tinyt.runtime.generate as gen
from tinyt.hardware import cpu_features
from tinyt.runtime.sampling import SamplingParams, next_token

ROUNDS = 15


def unchecked(logits, params, rng, history):
    """next_token as it was before the check (greedy and temperature paths)."""
    if params.temperature == 0 and params.repetition_penalty == 1.0:
        return int(logits.argmax())
    z = logits.astype(np.float64) / params.temperature
    if params.top_k is not None and params.top_k < z.size:
        kth = np.partition(z, -params.top_k)[-params.top_k]
        z = np.where(z < kth, -np.inf, z)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    return min(int(np.searchsorted(np.cumsum(probs), rng.random(), side="right")),
               probs.size - 1)


def full_row(logits, params, rng, history):
    if not np.isfinite(logits).all():
        raise ValueError("not finite")
    return unchecked(logits, params, rng, history)


def per_call_us(fn, *args, n=2000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter() - t0) / n * 1e6


def interleaved(variants: dict, make_args, n=2000) -> dict[str, float]:
    samples = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, fn in variants.items():
            samples[name].append(per_call_us(fn, *make_args(), n=n))
    return {name: statistics.median(v) for name, v in samples.items()}


def main(artifact: str) -> None:
    flags = {k: v for k, v in cpu_features().items() if v is True}
    print(f"cpu: {cpu_features()['model']}; flags: {', '.join(sorted(flags))}")
    rng = np.random.default_rng(0)
    # "unchecked" is next_token as it was before the check (and before the top-k rework).
    variants = {"checked": next_token, "unchecked": unchecked, "full-row check": full_row}
    for vocab in (2048, 50257):
        row = rng.standard_normal(vocab).astype(np.float32)
        for label, params in (("greedy", SamplingParams()),
                              ("top-k 50, T 0.8", SamplingParams(temperature=0.8, top_k=50))):
            n = 2000 if params.temperature == 0 else 200
            got = interleaved(variants, lambda row=row, params=params: (
                row, params, np.random.default_rng(0), []), n)
            print(f"next_token vocab {vocab:6d} {label:16s} " + "  ".join(
                f"{k} {v:7.2f} us" for k, v in got.items())
                + f"  (checked - unchecked: {got['checked'] - got['unchecked']:+.2f} us)")
    lm = rt.load(artifact, threads=1)
    prompt, steps = "def f(x):\n    return", min(60, lm.context - 16)

    def decode_ms() -> float:
        one = time.perf_counter()
        lm.generate(prompt, max_new_tokens=1, temperature=0)
        one = time.perf_counter() - one
        t = time.perf_counter()
        lm.generate(prompt, max_new_tokens=steps, min_new_tokens=steps, temperature=0)
        return ((time.perf_counter() - t) - one) / (steps - 1) * 1e3

    samples = {"checked": [], "unchecked": []}
    for _ in range(ROUNDS):
        for name, fn in (("checked", next_token), ("unchecked", unchecked)):
            gen.next_token = fn
            samples[name].append(statistics.median(decode_ms() for _ in range(5)))
    gen.next_token = next_token
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"decode {artifact} (1 thread, greedy, {steps} tokens): checked "
          f"{med['checked']:.4f} ms/token, unchecked {med['unchecked']:.4f} ms/token, "
          f"ratio {med['checked'] / med['unchecked']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "artifacts/onnx-int8-gqa")
