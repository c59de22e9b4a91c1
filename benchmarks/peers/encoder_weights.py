"""Briefly trained weights for the encoder peer benchmark (encoders.py, --train):
a short unsupervised SimCSE run (Gao, Yao and Chen 2021) of a sentence-transformers
directory's BertModel, from the weights it holds (the benchmark's seeded random init).

    stdlib docstrings (tinyt.data.load_corpus's train split; the retrieval set held out)
        │ a batch of B texts, each encoded twice with dropout on: two views [2, B, C]
        ▼ pooled as the directory pools (mean / CLS), cosine of every view-1 text to every
          view-2 text [B, B] / TEMPERATURE ──cross-entropy, the diagonal the positives──▶ loss
    ST_DIR ─AdamW, warmup then linear decay, seeded─▶ OUT (ST_DIR's files, the new weights)

Why: random weights crowd every text near one direction (cosines 0.86-0.99 between unrelated
texts), so INT8's rounding reorders near-ties and recall@10 measures the init, not the
quantization. The contrastive loss pushes different texts apart (in-batch negatives), which
is what a trained embedding model's geometry has and random weights lack.

The texts are the first paragraphs of the docstrings of the standard library's training files
(English prose, the corpus every machine with Python has): none of the retrieval set's queries
or passages occurs in the corpus, and any docstring sharing one of them as a substring would be
dropped, so the recall@10 evaluation stays held out. Deterministic: the batches' order, the
dropout masks and the init are seeded; the same machine and thread count give the same weights.
This module imports torch and transformers inside its functions: encoder_adapters.py's
workers import only the standard library and numpy.
"""
from __future__ import annotations

import ast
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

TEMPERATURE = 0.05  # SimCSE's
MAX_TOKENS = 32  # a docstring's first paragraph, cut: most fit, and a step stays cheap
TEXT_CHARS = (40, 300)  # first paragraphs kept: a sentence at least, a paragraph at most
CLIP = 1.0  # the gradient's norm, at most: post-norm BERT from a random init diverges easily
WARMUP = 0.1  # of the steps, the learning rate rising linearly from 0, then falling to 0
DEFAULTS = {"steps": 30, "batch_size": 64, "lr": 3e-4, "seed": 0}


def training_texts() -> list[str]:
    """The first paragraphs (whitespace collapsed) of every module, class and function
    docstring in tinyt.data.load_corpus()'s training files, in file order, each once; texts that
    hold or are held in a query or passage of the retrieval set are left out."""
    from tinyt.data import load_corpus
    from tinyt.export.retrieval_set import PASSAGES, QUERIES

    held_out = [t.lower() for t in (*QUERIES, *PASSAGES)]
    out, seen = [], set()
    for source in load_corpus().train:
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a file of another Python's grammar: its docstrings are skipped
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            text = " ".join(doc.split("\n\n")[0].split()) if doc else ""
            if not TEXT_CHARS[0] <= len(text) <= TEXT_CHARS[1] or text in seen:
                continue
            low = text.lower()
            if any(h in low or low in h for h in held_out):
                continue
            seen.add(text)
            out.append(text)
    return out


def _pool(h, mask, pooling: str):
    """[B, C] from hidden states [B, T, C] as sentence-transformers pools (before Normalize)."""
    if pooling == "cls":
        return h[:, 0]
    if pooling != "mean":
        raise ValueError(f"pooling {pooling!r}: training takes mean or cls")
    m = mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)


def _lr(step: int, steps: int, peak: float) -> float:
    warm = max(1, math.ceil(WARMUP * steps))
    return peak * (step + 1) / warm if step < warm else peak * (steps - step) / (steps - warm)


def train(st_dir: Path, out: Path, *, pooling: str, transformer: str = "",
          steps: int = DEFAULTS["steps"], batch_size: int = DEFAULTS["batch_size"],
          lr: float = DEFAULTS["lr"], seed: int = DEFAULTS["seed"],
          texts: list[str] | None = None, log=print) -> dict:
    """SimCSE-train st_dir's Transformer for `steps` steps of `batch_size` texts (default:
    training_texts()) and write `out`: st_dir's files, the Transformer's (in its folder
    `transformer`, modules.json's path) with the new weights. Returns what was done: the loss
    per step, the seconds (wall, and this process's CPU time: on a shared machine the wall time
    is the load's too), the texts' count and the settings."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    problems = [text for ok, text in (
        (isinstance(steps, int) and steps >= 1, f"steps={steps!r}: an integer >= 1"),
        (isinstance(batch_size, int) and batch_size >= 2,
         f"batch_size={batch_size!r}: an integer >= 2 (one positive, the rest negatives)"),
        (lr > 0, f"lr={lr!r}: above 0"), (pooling in ("mean", "cls"),
                                          f"pooling={pooling!r}: mean or cls")) if not ok]
    if Path(out).exists():
        problems.append(f"{out} exists; training writes a new directory")
    if problems:
        raise ValueError("; ".join(problems))
    texts = training_texts() if texts is None else list(texts)
    if len(texts) < batch_size:
        raise ValueError(f"{len(texts)} training texts, fewer than batch_size={batch_size}")
    t0, c0 = time.perf_counter(), time.process_time()
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(Path(st_dir) / transformer)
    model = AutoModel.from_pretrained(Path(st_dir) / transformer, attn_implementation="eager")
    model.train()  # dropout on: the two views of a text differ by their masks only
    params = [p for n, p in model.named_parameters() if not n.startswith("pooler.")]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    order, at = rng.permutation(len(texts)), 0
    losses = []
    for step in range(steps):
        if at + batch_size > len(order):  # a new epoch: a new order
            order, at = rng.permutation(len(texts)), 0
        batch = [texts[i] for i in order[at:at + batch_size]]
        at += batch_size
        x = tok(batch, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
        x = {k: torch.cat([v, v]) for k, v in x.items()}  # [2B, T]: both views in one pass
        e = _pool(model(**x).last_hidden_state, x["attention_mask"], pooling)  # [2B, C]
        e = torch.nn.functional.normalize(e, dim=-1)
        a, b = e[:batch_size], e[batch_size:]
        logits = a @ b.T / TEMPERATURE  # [B, B]: text i's positive at column i
        loss = torch.nn.functional.cross_entropy(logits, torch.arange(batch_size))
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, lr)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        losses.append(loss.item())
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"  step {step + 1}/{steps}: loss {losses[-1]:.4f} "
                f"({time.perf_counter() - t0:.0f} s)")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    shutil.copytree(st_dir, out, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    model.eval().save_pretrained(Path(out) / transformer, safe_serialization=True)
    info = {"method": "SimCSE (unsupervised, dropout views, in-batch negatives)",
            "texts": len(texts), "text_source": "first paragraphs of the standard library's "
            "docstrings (tinyt.data.load_corpus train split), the retrieval set held out",
            "steps": steps, "batch_size": batch_size, "lr": lr, "temperature": TEMPERATURE,
            "max_tokens": MAX_TOKENS, "clip": CLIP, "seed": seed, "pooling": pooling,
            "threads": torch.get_num_threads(), "seconds": seconds, "cpu_seconds": cpu,
            "loss": losses}
    (Path(out) / "simcse.json").write_text(json.dumps(info, indent=1) + "\n")
    return info
