"""`demo` against `llama-demo`: the same parameter count in GPT-2's form and in the Llama
family's (RMSNorm, rotary positions, SwiGLU, 2 key/value heads for 4 query heads), trained by
the same loop on the same built-in corpus, tokenizer, batches and seed.

    demo        ──train (STEPS)──▶ history: val loss and train seconds every EVAL steps ─┐
    llama-demo  ──train (STEPS)──▶ history ───────────────────────────────────────────────┴─▶
        validation loss after the same steps, and after the same training time (each
        history read at the shorter run's total, linearly between evaluations); KV-cache
        bytes per token; parameters ──▶ OUT/llama-demo.json, OUT/llama-demo.md

    .venv/bin/python -m lab.llama_demo --out benchmarks/results/llama-demo-xeon-amx

The runs are sequential, so one does not slow the other; each records its own seconds.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

PRESETS = ("demo", "llama-demo")


def _train(name: str, steps: int, every: int, out: Path, data: str | None) -> dict:
    from tinyt.checkpoint import load_checkpoint
    from tinyt.config import preset
    from tinyt.train import train

    model_cfg, train_cfg = preset(name, max_steps=steps, eval_interval=every)
    path = train(model_cfg, train_cfg, out / name, data=data, log=lambda s: None)
    ck = load_checkpoint(path)
    history = json.loads((path / "train_state.json").read_text())["history"]
    return {"preset": name, "model": ck.config.to_dict(),
            "parameters": ck.model.num_parameters(),
            "kv_cache_bytes_per_token": ck.config.kv_cache_bytes_per_token(),
            "history": [{k: h[k] for k in ("step", "val_loss", "train_seconds")}
                        for h in history]}


def loss_at_seconds(history: list[dict], seconds: float) -> float:
    """Validation loss at `seconds` of training, linear between evaluations."""
    t = [0.0] + [h["train_seconds"] for h in history]
    v = [history[0]["val_loss"]] + [h["val_loss"] for h in history]
    return float(np.interp(seconds, t[1:], v[1:]) if seconds >= t[1] else v[1])


def compare(runs: dict[str, dict]) -> dict:
    end = min(r["history"][-1]["train_seconds"] for r in runs.values())
    return {name: {"parameters": r["parameters"],
                   "kv_cache_bytes_per_token": r["kv_cache_bytes_per_token"],
                   "steps": r["history"][-1]["step"],
                   "val_loss_after_steps": r["history"][-1]["val_loss"],
                   "train_seconds": r["history"][-1]["train_seconds"],
                   "val_loss_at_same_seconds": loss_at_seconds(r["history"], end),
                   "same_seconds": end} for name, r in runs.items()}


def markdown(table: dict, env: dict) -> str:
    rows = ["| preset | parameters | KV bytes / token | val loss after "
            f"{next(iter(table.values()))['steps']} steps | train s | val loss at "
            f"{next(iter(table.values()))['same_seconds']:.0f} s |", "|---|---|---|---|---|---|"]
    for name, r in table.items():
        rows.append(f"| {name} | {r['parameters']:,} | {r['kv_cache_bytes_per_token']:,} | "
                    f"{r['val_loss_after_steps']:.4f} | {r['train_seconds']:.0f} | "
                    f"{r['val_loss_at_same_seconds']:.4f} |")
    cpu = env["cpu"]
    flags = [k for k, v in cpu.items() if v is True]
    return (f"# demo vs llama-demo\n\nCPU: {cpu['model'] or cpu['machine']} ({', '.join(flags)}); "
            f"torch {env['versions']['torch']}; threads {env['threads']}\n\n"
            + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> None:
    import torch

    from tinyt.benchmarks.environment import environment

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-interval", type=int, default=50)
    ap.add_argument("--data", help="corpus (default: the built-in one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: _train(name, args.steps, args.eval_interval, Path(tmp), args.data)
                for name in PRESETS}
    env = environment(("tinyt", "torch"), threads=torch.get_num_threads(),
                      command=f".venv/bin/python -m lab.llama_demo --out {args.out} "
                              f"--steps {args.steps} --eval-interval {args.eval_interval}")
    table = compare(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llama-demo.json").write_text(json.dumps(
        {"environment": env, "table": table, "runs": runs}, indent=2))
    (args.out / "llama-demo.md").write_text(markdown(table, env) +
                                            f"\nCommand: `{env['command']}`\n")
    print(markdown(table, env))


if __name__ == "__main__":
    main()
