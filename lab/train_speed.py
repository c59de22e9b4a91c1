"""Training throughput of a preset on this CPU: what the main job's training step costs here,
at 1 and 2 threads, eager and under torch.compile, so the README can say per CPU kind how long
the demo trains.

    .venv/bin/python -m lab.train_speed --preset demo \
        --out benchmarks/results/train-speed-epyc-avx2

One step is what tinyt.train runs (forward, cross-entropy, backward, gradient clipping, AdamW)
on a batch of the preset's size (random token ids: the step's cost does not depend on the
text). Variants run in interleaved rounds (median of each); torch.compile's compile time is
reported apart. Projected training = the preset's max_steps x the median step (evaluation
and checkpoints, a few seconds, not included).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tinyt.benchmarks.environment import environment
from tinyt.config import PRESETS, ModelConfig, TrainConfig
from tinyt.model import build_model
from tinyt.train import make_optimizer


def variant(preset: str, compiled: bool):
    """A step closure on a fresh model, and the seconds its first step took (compilation)."""
    torch.manual_seed(0)
    mcfg = ModelConfig(**PRESETS[preset]["model"])
    tcfg = TrainConfig(**PRESETS[preset]["train"])
    model = build_model(mcfg)
    model.train()
    optimizer = make_optimizer(model, tcfg)
    forward = torch.compile(model) if compiled else model
    B, T = tcfg.batch_size, mcfg.block_size
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, mcfg.vocab_size, (B, T), generator=g)
    y = torch.randint(0, mcfg.vocab_size, (B, T), generator=g)

    def step() -> None:
        logits, _ = forward(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip or math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    t = time.perf_counter()
    step()
    return step, time.perf_counter() - t, B * T, tcfg.max_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="demo", choices=sorted(PRESETS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per variant per round")
    ap.add_argument("--no-compile", action="store_true", help="eager only")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1:
        ap.error("--rounds and --steps must be >= 1")
    threads = [int(n) for n in args.threads.split(",")]
    names = [(n, c) for n in threads for c in ([False] if args.no_compile else [False, True])]
    steps, compile_s, samples = {}, {}, {}
    for n, c in names:
        torch.set_num_threads(n)
        key = f"{'compiled' if c else 'eager'}@{n}"
        steps[key], compile_s[key], tokens, max_steps = variant(args.preset, c)
        samples[key] = []
    for _ in range(args.rounds + 1):  # the first round warms up and is not kept
        for (n, _c), key in zip(names, steps):
            torch.set_num_threads(n)
            t = time.perf_counter()
            for _ in range(args.steps):
                steps[key]()
            samples[key].append((time.perf_counter() - t) / args.steps)
    env = environment(("tinyt", "torch"),
                      torch_cpu_capability=torch.backends.cpu.get_cpu_capability())
    cpu = env["cpu"]
    results = {"preset": args.preset, "tokens_per_step": tokens, "max_steps": max_steps,
               "environment": env, "variants": {}}
    lines = [f"CPU: {cpu['model']} (avx2={cpu['avx2']}, avx512f={cpu['avx512f']}, "
             f"avx512_vnni={cpu['avx512_vnni']}, amx_bf16={cpu['amx_bf16']}); torch "
             f"{torch.__version__} ({env['torch_cpu_capability']} kernels); preset "
             f"{args.preset}, {tokens} tokens a step, {max_steps} steps", "",
             "| variant | ms / step | tokens/s | projected training | first step (compile) |",
             "|---|---|---|---|---|"]
    for key, v in samples.items():
        ms = statistics.median(v[1:]) * 1e3
        results["variants"][key] = {"ms_per_step": ms, "tokens_per_s": tokens / ms * 1e3,
                                    "projected_s": ms * max_steps / 1e3,
                                    "first_step_s": compile_s[key], "samples_ms": [
                                        x * 1e3 for x in v[1:]]}
        lines.append(f"| {key} | {ms:.1f} | {tokens / ms * 1e3:,.0f} | "
                     f"{ms * max_steps / 1e3 / 60:.1f} min | {compile_s[key]:.1f} s |")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
