"""Time to first token with a held prompt prefix against the same request computed whole: the
engine's prefix store (runtime/prefix.py) at the GPT-2-small shape.

    ARTIFACT (a shared-cache graph; --build gpt2-small makes one: random weights at GPT-2
    small's shape, INT8 MatMulNBits, `optimize --target gqa`)
    two engines on it, one with the prefix store, one without (prefix_cache_bytes=0)
    a PREFIX-token prompt from held-out text, held by the first engine (one request before)
    each round, both engines in turn (which goes first alternates): PREFIX + a fresh
    SUFFIX-token tail, one new token; time from submit to the first token
    ──▶ the same first token from both (checked every round), medians, the ratio
    ──▶ OUT/prefix-reuse.json, OUT/prefix-reuse.md

    .venv/bin/python -m lab.prefix_reuse --build gpt2-small --work /tmp/gpt2s \\
        --out benchmarks/results/prefix-reuse-gpt2-small-<cpu>
"""
from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
from pathlib import Path

PREFIX, SUFFIX, ROUNDS = 512, 16, 10


def build_gpt2_small(work: Path) -> Path:
    """Random weights at GPT-2 small's shape (the gpt2-small preset), a byte-level BPE of 8,192
    ids trained on the standard library (the table padded to 50,257), exported, optimized,
    INT8 (MatMulNBits: each row computed alone) and made a shared-cache graph."""
    import torch

    from tinyt.checkpoint import save_checkpoint
    from tinyt.config import preset
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize
    from tinyt.model import build_model
    from tinyt.tokenizer import Tokenizer

    out = work / "int8-gqa"
    if (out / "manifest.json").is_file():
        return out
    cfg, _ = preset("gpt2-small")
    torch.manual_seed(0)
    ckpt = work / "checkpoint"
    if not (ckpt / "model.safetensors").is_file():
        lib = Path(sysconfig.get_paths()["stdlib"])
        texts = [(lib / n).read_text(encoding="utf-8") for n in
                 ("textwrap.py", "string.py", "shlex.py", "fnmatch.py", "argparse.py")]
        save_checkpoint(ckpt, build_model(cfg).eval(), Tokenizer.train_bpe(texts, 8192))
    onnx = export_onnx(ckpt, work / "onnx") if not (work / "onnx/manifest.json").is_file() \
        else work / "onnx"
    opt = optimize(onnx, work / "opt") if not (work / "opt/manifest.json").is_file() \
        else work / "opt"
    q = quantize(opt, work / "int8") if not (work / "int8/manifest.json").is_file() \
        else work / "int8"
    return optimize(q, out, target="gqa")


def _ttft(engine, ids: list[int]) -> tuple[float, int]:
    from tinyt.runtime.engine import Done, Token
    from tinyt.runtime.sampling import SamplingParams

    req = engine.submit(ids, SamplingParams(max_new_tokens=1))
    while True:
        ev = req.next_event(600)
        if isinstance(ev, Token):
            req.wait(600)
            return ev.at - req.submitted, ev.id
        if isinstance(ev, Done) or ev is None:
            raise RuntimeError(f"no token: {ev}")


def measure(artifact: Path, *, prefix: int = PREFIX, suffix: int = SUFFIX,
            rounds: int = ROUNDS, threads: int | None = None) -> dict:
    import tinyt.runtime as rt
    from tinyt import data as D
    from tinyt.benchmarks.environment import environment
    from tinyt.runtime.engine import Engine

    lm = rt.load(artifact, threads=threads)
    texts = D.load_corpus(None).val
    held = D.held_out_prompts(lm.tokenizer, texts, 1, prefix)[0]
    tails = D.held_out_prompts(lm.tokenizer, texts, rounds + 1, suffix)
    reuse, whole = Engine(lm, max_batch=4).start(), Engine(lm, max_batch=4,
                                                           prefix_cache_bytes=0).start()
    try:
        _ttft(reuse, held + tails[-1])  # the prefix is held from here on
        _ttft(whole, held + tails[-1])  # (and both engines warm)
        times: dict[str, list[float]] = {"reuse": [], "whole": []}
        for r in range(rounds):
            ids = held + tails[r]
            order = [("reuse", reuse), ("whole", whole)][:: 1 if r % 2 == 0 else -1]
            firsts = {}
            for name, engine in order:
                t, tok = _ttft(engine, ids)
                times[name].append(t)
                firsts[name] = tok
            if firsts["reuse"] != firsts["whole"]:
                raise RuntimeError(f"round {r}: the first tokens differ ({firsts}): reuse did "
                                   "not compute what computing the prompt gives")
        reused = reuse.prefix_reused_tokens
    finally:
        reuse.stop()
        whole.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"artifact": str(artifact), "prefix_tokens": prefix, "suffix_tokens": suffix,
            "rounds": rounds, "threads": threads, "reused_tokens": reused,
            "ttft_ms": {k: [round(1e3 * t, 2) for t in v] for k, v in times.items()},
            "median_ms": {k: round(1e3 * v, 2) for k, v in med.items()},
            "speedup": round(med["whole"] / med["reuse"], 2),
            "environment": environment()}


def markdown(r: dict) -> str:
    return "\n".join([
        f"# Time to first token: a held {r['prefix_tokens']}-token prefix + {r['suffix_tokens']}"
        " new tokens", "",
        f"CPU: {r['environment']['cpu'].get('model')}, threads: {r['threads'] or 'default'}, "
        f"{r['rounds']} interleaved rounds; the same first token from both every round.", "",
        "| engine | median ms | rounds (ms) |", "|---|---|---|",
        *[f"| {k} | {r['median_ms'][k]} | {', '.join(map(str, r['ttft_ms'][k]))} |"
          for k in ("reuse", "whole")], "",
        f"Reuse is **{r['speedup']}x** faster ({r['reused_tokens']} tokens copied in all).", ""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", type=Path, nargs="?", help="a shared-cache artifact")
    ap.add_argument("--build", choices=["gpt2-small"], help="make the artifact in --work")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tinyt-prefix-reuse"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prefix", type=int, default=PREFIX)
    ap.add_argument("--suffix", type=int, default=SUFFIX)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--threads", type=int)
    args = ap.parse_args(argv)
    if (args.artifact is None) == (args.build is None):
        ap.error("give an ARTIFACT or --build gpt2-small")
    artifact = args.artifact or build_gpt2_small(args.work)
    r = measure(artifact, prefix=args.prefix, suffix=args.suffix, rounds=args.rounds,
                threads=args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefix-reuse.json").write_text(json.dumps(r, indent=1))
    (args.out / "prefix-reuse.md").write_text(markdown(r))
    print(markdown(r))


if __name__ == "__main__":
    main()
