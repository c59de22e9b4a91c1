"""What a quantized artifact does to a real model, measured through tinyt.runtime as a user
runs it (docs/quantization.md's real-model table):

    held-out prose (Python's pydoc_data.topics, ~2,048 tokens) ──prompt_logprobs──▶ perplexity
    windows' last positions ──steps──▶ KL(fp32 || artifact) of the next-token distribution
    prompts ──greedy 64 tokens──▶ agreement with the fp32 artifact's tokens

    python -m benchmarks.real_quality REF_DIR DIR [DIR ...] [--ct2 CT2_DIR] [--out results.json]

REF_DIR is the fp32 artifact (onnx-opt). --ct2: a CTranslate2 model of the same weights (its
own converter, e.g. `ct2-transformers-converter --model HF_DIR --output_dir CT2_DIR
--quantization int8`), scored on the same windows and positions through its forward pass, for
scale (no greedy agreement: its generate loop is its own). A shared-cache pair is measured as
loaded with tune=False: prompts (and perplexity) through its prompt graph, steps through its
step graph.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

import numpy as np

WINDOW = 512  # tokens per scored window: four windows make the ~2,048 of the table
WINDOWS = 4
PROMPTS = 12  # greedy prompts (first 24 tokens of a held-out passage each)
PROMPT_TOKENS = 24
NEW_TOKENS = 64


def heldout_text() -> str:
    """Prose no tinyt corpus trains on: the pydoc topics (the help() pages), in key order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def windows(tokenizer, n: int = WINDOWS, size: int = WINDOW) -> list[list[int]]:
    ids = tokenizer.encode(heldout_text())
    step = len(ids) // n
    return [ids[i * step: i * step + size] for i in range(n)]


def measure(ref_lm, lm, wins: list[list[int]], prompts: list[list[int]],
            ref_tokens: list[list[int]] | None) -> dict:
    from tinyt.contract import DECODER_WITH_PAST
    from tinyt.runtime.feeds import prefill_feeds

    nll, count = 0.0, 0
    for w in wins:
        lp = lm.prompt_logprobs(w)[1:]
        nll -= sum(p.logprob for p in lp)
        count += len(lp)
    kls = []
    for w in wins:  # the next-token distribution after every 64th prefix of each window
        for end in range(64, len(w) + 1, 64):
            feeds = prefill_feeds(lm.config, DECODER_WITH_PAST, np.array([w[:end]]),
                                  np.ones((1, end), np.int64))
            a = next(ref_lm.steps(dict(feeds)))[0, -1].astype(np.float64)
            b = next(lm.steps(dict(feeds)))[0, -1].astype(np.float64)
            la, lb = a - np.logaddexp.reduce(a), b - np.logaddexp.reduce(b)
            kls.append(float((np.exp(la) * (la - lb)).sum()))
    got = [r.token_ids for r in lm.generate_ids(prompts, max_new_tokens=NEW_TOKENS,
                                                min_new_tokens=NEW_TOKENS)]
    out = {"perplexity": math.exp(nll / count), "scored_tokens": count,
           "kl_mean": float(np.mean(kls)), "kl_positions": len(kls), "tokens": got}
    if ref_tokens is not None:
        same = sum(a == b for g, r in zip(got, ref_tokens) for a, b in zip(g, r))
        out["greedy_agreement"] = same / sum(map(len, ref_tokens))
    return out


def measure_ct2(ref_lm, path: str, wins: list[list[int]]) -> dict:
    """Perplexity and KL of a CTranslate2 generator on the same windows and positions."""
    import ctranslate2

    from tinyt.contract import DECODER_WITH_PAST
    from tinyt.runtime.feeds import prefill_feeds

    gen = ctranslate2.Generator(path, device="cpu", intra_threads=1)
    names = ref_lm.tokenizer.hf  # the tokenizers library object: ids to CTranslate2 tokens

    def logits(ids: list[int]) -> np.ndarray:
        out = gen.forward_batch([[names.id_to_token(i) for i in ids]])
        return np.asarray(out, dtype=np.float64)[0]

    nll, count, kls = 0.0, 0, []
    for w in wins:
        z = logits(w)
        lz = z - np.logaddexp.reduce(z, axis=-1, keepdims=True)
        nll -= float(lz[np.arange(len(w) - 1), w[1:]].sum())
        count += len(w) - 1
        for end in range(64, len(w) + 1, 64):
            feeds = prefill_feeds(ref_lm.config, DECODER_WITH_PAST, np.array([w[:end]]),
                                  np.ones((1, end), np.int64))
            a = next(ref_lm.steps(dict(feeds)))[0, -1].astype(np.float64)
            la = a - np.logaddexp.reduce(a)
            kls.append(float((np.exp(la) * (la - lz[end - 1])).sum()))
    return {"perplexity": math.exp(nll / count), "scored_tokens": count,
            "kl_mean": float(np.mean(kls)), "kl_positions": len(kls)}


def main() -> None:
    from tinyt.hardware import cpu_features
    from tinyt.runtime import load

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref")
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--ct2")
    ap.add_argument("--out")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    ref = load(a.ref, threads=a.threads, tune=False)
    wins = windows(ref.tokenizer)
    ids = ref.tokenizer.encode(heldout_text())
    prompts = [ids[j: j + PROMPT_TOKENS] for j in
               np.linspace(100, len(ids) - 200, PROMPTS).astype(int)]
    base = measure(ref, ref, wins, prompts, None)
    rows = {a.ref: {k: v for k, v in base.items() if k != "tokens"}}
    print(f"{a.ref}: perplexity {base['perplexity']:.4f}")
    for d in a.dirs:
        lm = load(d, threads=a.threads, tune=False)
        r = measure(ref, lm, wins, prompts, base["tokens"])
        r.pop("tokens")
        r["perplexity_change"] = r["perplexity"] / base["perplexity"] - 1
        rows[d] = r
        print(f"{d}: perplexity {r['perplexity']:.4f} ({100 * r['perplexity_change']:+.2f}%), "
              f"KL {r['kl_mean']:.2e}, greedy agreement {100 * r['greedy_agreement']:.1f}%",
              flush=True)
    if a.ct2:
        r = measure_ct2(ref, a.ct2, wins)
        r["perplexity_change"] = r["perplexity"] / base["perplexity"] - 1
        rows[f"ctranslate2:{a.ct2}"] = r
        print(f"CTranslate2 {a.ct2}: perplexity {r['perplexity']:.4f} "
              f"({100 * r['perplexity_change']:+.2f}%), KL {r['kl_mean']:.2e}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"cpu": cpu_features(),
                                           "machine": platform.processor(), "rows": rows},
                                          indent=1))


if __name__ == "__main__":
    main()
