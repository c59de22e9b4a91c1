"""What quantization costs on a task, measured by lm-evaluation-harness through `tinyt serve`:
the same trained model's fp32, INT8 and INT4 shared-cache artifacts, each served in a process
of its own, scored by lm-eval's `local-completions` model (token ids, echo, logprobs: the
loglikelihood requests vLLM's server answers) on the built-in next-line task
(benchmarks/lm_eval_task.py), each loglikelihood first checked against tinyt.runtime's own for
the same artifact.

    CHECKPOINT (or the llama-demo preset trained here) ──export, optimize──▶ fp32-gqa
        ──quantize (INT8 | --bits 4)──▶ optimize --target gqa ──▶ int8-gqa, int4-gqa
    each: tinyt serve ◀── lm_eval.simple_evaluate(local-completions, remote tokenizer)
          per choice: lm-eval's loglikelihood vs runtime prompt_logprobs (max |diff|)
    ──▶ OUT/lm-eval.json, OUT/lm-eval.md: acc, acc_norm, the diff, KL-free: just the task

    .venv/bin/python -m benchmarks.lm_eval_quant --out benchmarks/results/lm-eval-llama-demo-<cpu>

lm-eval comes from the `eval` extra (pip install -e ".[eval]").
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from .lm_eval_task import TASK, make_docs, runtime_loglikelihoods, write_task

# the shared-cache graphs it builds and serves, under its own root (not the artifact catalogue's
# rows: tinyt.artifacts)
SERVED = ("fp32-gqa", "int8-gqa", "int4-gqa")


def build(ckpt: Path, root: Path, variants: tuple[str, ...] = SERVED,
          data: str | None = None) -> dict[str, Path]:
    """The served artifacts of a checkpoint."""
    from tinyt.export import export_onnx
    from tinyt.export.optimize import optimize
    from tinyt.export.quantize import quantize

    onnx = root / "onnx"
    if not (onnx / "manifest.json").is_file():
        export_onnx(ckpt, onnx)
    opt = root / "opt"
    if not (opt / "manifest.json").is_file():
        optimize(onnx, opt)
    out = {}
    for v in variants:
        target = root / v
        if not (target / "manifest.json").is_file():
            if v == "fp32-gqa":
                optimize(opt, target, target="gqa")
            else:
                q = root / v.replace("-gqa", "")
                if not (q / "manifest.json").is_file():
                    quantize(opt, q, bits=4 if v.startswith("int4") else 8, data=data)
                optimize(q, target, target="gqa")
        out[v] = target
    return out


def evaluate(artifact: Path, task_dir: Path, docs: list[dict], *,
             threads: int | None = None) -> dict:
    """lm-eval's results for one artifact served by tinyt serve, and how far each of its
    loglikelihoods is from tinyt.runtime's own."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    import tinyt.runtime as rt

    from .serving import Server

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the task's data is a local file
    lm = rt.load(artifact, threads=1, tune=False)
    server = Server("tinyt-serve", artifact, threads, max_batch=4)
    t0 = time.perf_counter()
    try:
        res = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={"base_url": f"http://127.0.0.1:{server.port}/v1/completions",
                        "model": "m", "tokenizer_backend": "remote", "tokenized_requests": True,
                        "num_concurrent": 1, "max_retries": 1,
                        "max_length": lm.context - 1},
            tasks=[TASK], task_manager=TaskManager(include_path=str(task_dir)),
            log_samples=True, bootstrap_iters=0, random_seed=0, numpy_random_seed=0,
            torch_random_seed=0, fewshot_random_seed=0)
    finally:
        server.stop()
    seconds = time.perf_counter() - t0
    ours = runtime_loglikelihoods(lm, docs)
    theirs = {s["doc_id"]: [float(r[0][0]) for r in s["resps"]] for s in res["samples"][TASK]}
    diff = max(abs(a - b) for i, row in enumerate(ours) for a, b in zip(row, theirs[i]))
    correct = [max(range(len(row)), key=row.__getitem__) == d["label"]
               for row, d in zip(ours, docs)]
    metrics = res["results"][TASK]
    return {"acc": metrics["acc,none"], "acc_norm": metrics["acc_norm,none"],
            "runtime_acc": sum(correct) / len(correct), "max_loglikelihood_diff": diff,
            "docs": len(docs), "seconds": round(seconds, 1),
            "loglikelihoods": {"lm_eval": [theirs[i] for i in range(len(docs))],
                               "runtime": ours}}


def run(out: Path, *, checkpoint: Path | None = None, count: int = 200,
        variants: tuple[str, ...] = SERVED, threads: int | None = None,
        data: str | None = None, work: Path | None = None, steps: int | None = None) -> dict:
    import tempfile

    import tinyt.runtime as rt

    from .environment import environment

    work = work or Path(tempfile.gettempdir()) / "tinyt-lm-eval"  # artifacts: not in results
    if checkpoint is None:  # the llama-demo preset, trained on the built-in corpus
        from tinyt.config import preset
        from tinyt.train import train

        checkpoint = work / "checkpoint"
        if not (checkpoint / "model.safetensors").is_file():
            model_cfg, train_cfg = preset("llama-demo", **({} if steps is None
                                                           else {"max_steps": steps}))
            train(model_cfg, train_cfg, checkpoint, data=data, log=lambda s: None)
    artifacts = build(checkpoint, work, variants, data)
    lm = rt.load(artifacts[variants[0]], threads=1, tune=False)
    docs = make_docs(lm.tokenizer, count, lm.context - 2, data=data)
    task_dir = write_task(work / "task", docs)
    result = {"task": TASK, "docs": count, "checkpoint": str(checkpoint),
              "train_steps": steps,
              "environment": environment(("tinyt", "numpy", "onnxruntime", "lm_eval")),
              "variants": {}}
    for v in variants:
        result["variants"][v] = evaluate(artifacts[v], task_dir, docs, threads=threads)
        r = result["variants"][v]
        print(f"{v}: acc {r['acc']:.3f} acc_norm {r['acc_norm']:.3f} (runtime's own argmax "
              f"{r['runtime_acc']:.3f}); max |lm-eval - runtime| loglikelihood "
              f"{r['max_loglikelihood_diff']:.2e} over {r['docs']} docs, {r['seconds']} s")
    out.mkdir(parents=True, exist_ok=True)
    (out / "lm-eval.json").write_text(json.dumps(result, indent=1))
    (out / "lm-eval.md").write_text(markdown(result))
    return result


def markdown(result: dict) -> str:
    import numpy as np

    variants = result["variants"]
    first = next(iter(variants))
    base = np.array(variants[first]["loglikelihoods"]["runtime"])
    cpu = result["environment"]["cpu"]
    flags = ", ".join(k for k in ("avx2", "avx512_vnni", "amx_int8") if cpu.get(k))
    lines = [f"# {result['task']}: {result['docs']} questions, one true next line of 4 "
             "(chance 0.25)", "",
             f"CPU: {cpu.get('model')} ({flags}); the llama-demo preset trained "
             f"{result.get('train_steps') or 600} steps on the built-in corpus; each artifact "
             "served by `tinyt serve`, scored by lm-eval's local-completions.", "",
             "`.venv/bin/python -m benchmarks.lm_eval_quant --out OUT --count "
             f"{result['docs']}`", "",
             "| artifact | acc | acc_norm | runtime's argmax acc | same choice as "
             f"{first} | mean abs loglikelihood change vs {first} | max abs diff lm-eval vs "
             "runtime | seconds |", "|---|---|---|---|---|---|---|---|"]
    for v, r in variants.items():
        ll = np.array(r["loglikelihoods"]["runtime"])
        same = float((ll.argmax(1) == base.argmax(1)).mean())
        lines.append(f"| {v} | {r['acc']:.3f} | {r['acc_norm']:.3f} | {r['runtime_acc']:.3f} "
                     f"| {same:.3f} | {np.abs(ll - base).mean():.3f} "
                     f"| {r['max_loglikelihood_diff']:.1e} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint", type=Path, help="a causal-LM checkpoint (default: train "
                    "the llama-demo preset on the built-in corpus)")
    ap.add_argument("--count", type=int, default=200, help="questions")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--data", help="a corpus directory (default: the built-in one)")
    ap.add_argument("--work", type=Path, help="where artifacts go (default: a directory "
                    "under the system's temporary one)")
    ap.add_argument("--steps", type=int, help="training steps of the llama-demo preset "
                    "(default: the preset's 600)")
    args = ap.parse_args(argv)
    run(args.out, checkpoint=args.checkpoint, count=args.count, threads=args.threads,
        data=args.data, work=args.work, steps=args.steps)


if __name__ == "__main__":
    main()
