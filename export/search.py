"""`--max-loss-increase`: try the quantization variants that apply to the source graph and
keep the fastest whose accuracy cost is within the budget.

    source ──quantize(variant) for each variant──▶ accuracy (vs source)
           ──within budget──▶ decode latency, interleaved ──▶ fastest ──▶ out/ (+ what was tried)

The budget is a relative validation-loss increase for a causal LM (0.02 = +2%), an absolute
accuracy drop for a classifier (0.02 = 2 points), and for an encoder the retrieval recall@10
lost against the source (0.02 = recall@10 at least 0.98; export/accuracy.py), the task its
embeddings serve. An encoder tries the dynamic variants that name no lm_head (it has none).
"""
from __future__ import annotations

import inspect
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tinyt.contract import CLASSIFIER, DECODER_WITH_PAST, ENCODER, ONNX_FILE, SEQ2SEQ
from tinyt.recipe import INT4_BLOCK, QuantRecipe
from tinyt.runtime.feeds import check_tokens
from tinyt.runtime.timing import session_latency_ms

from .accuracy import RECALL_K
from .compare import random_feeds
from .quantize import QuantizeError, quantize
from .stage import Built, open_source

# (name, quantize keyword arguments: the manifest's search record keeps them as written);
# static variants need the plain export. Each is a valid QuantRecipe (a test makes them).
DYNAMIC_VARIANTS = [
    ("dynamic-int8", dict(mode="dynamic", bits=8)),
    ("dynamic-int8-block32", dict(mode="dynamic", bits=8, block_size=32)),
    ("dynamic-int4", dict(mode="dynamic", bits=4, block_size=INT4_BLOCK)),
    ("dynamic-int4-lm_head-int8", dict(mode="dynamic", bits=4, block_size=INT4_BLOCK,
                                       keep_8bit=["lm_head"])),
    ("dynamic-int8-lm_head-fp32", dict(mode="dynamic", bits=8, exclude=["lm_head"])),
    ("dynamic-int8-qgemm", dict(mode="dynamic", bits=8, kernel="qgemm")),
]
STATIC_VARIANTS = [
    ("static-minmax-per-channel", dict(mode="static", calibration="minmax")),
    ("static-percentile-per-channel", dict(mode="static", calibration="percentile")),
    ("static-entropy-per-channel", dict(mode="static", calibration="entropy")),
    ("static-minmax-per-tensor", dict(mode="static", calibration="minmax", per_channel=False)),
]


def cost(accuracy: dict[str, Any]) -> float:
    """How much worse than the source: relative loss increase, accuracy points lost (a
    classifier with labelled text), labels that changed (an imported classifier, whose report
    has no labelled accuracy: the share disagreeing with the source), or retrieval recall@10
    lost (an encoder)."""
    if "val_loss_change" in accuracy:
        return accuracy["val_loss_change"]
    if f"recall_at_{RECALL_K}" in accuracy:
        return 1.0 - accuracy[f"recall_at_{RECALL_K}"]
    if "accuracy_change" in accuracy:
        return -accuracy["accuracy_change"]
    return 1.0 - accuracy["label_agreement"]


# The choices the search makes itself (quantize()'s keywords that make its QuantRecipe): a
# caller that also fixes one of them is refused.
CHOICES = ("bits", "block_size", "mode", "calibration", "per_channel", "reduce_range",
           "exclude", "kernel", "keep_8bit", "scheme", "scale_search")


def quantize_search(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                    max_loss_increase: float, data: str | None = None, **choices) -> Built:
    """`choices`: any of CHOICES a caller passed along (a CLI passes its flags); one that is
    not quantize()'s default is refused, since the search picks it."""
    src_dir = Path(src_dir)
    unknown = sorted(set(choices) - set(CHOICES))
    if unknown:
        raise TypeError(f"quantize_search() got unexpected arguments {unknown}")
    defaults = inspect.signature(quantize).parameters
    given = [k for k, v in choices.items()
             if v != defaults[k].default and not (k in ("exclude", "keep_8bit") and not v)]
    if given:
        flags = ", ".join("--no-per-channel" if k == "per_channel" else
                          "--" + k.replace("_", "-") for k in given)
        raise QuantizeError(f"--max-loss-increase chooses the variant itself; drop {flags}")
    if not (isinstance(max_loss_increase, (int, float)) and math.isfinite(max_loss_increase)
            and max_loss_increase >= 0):
        raise QuantizeError(f"max_loss_increase={max_loss_increase!r} must be a finite number "
                            ">= 0 (0.02 = validation loss at most 2% above the source's)")
    src = open_source(src_dir)  # hashed once for every variant tried
    cfg, kind = src.config, src.kind
    if kind == SEQ2SEQ:
        raise QuantizeError(f"{src_dir} is an encoder-decoder (seq2seq): --max-loss-increase "
                            "times one graph's decode step, and an encoder-decoder steps "
                            "through two; quantize it with a chosen recipe (--bits, --kernel, "
                            "--mode), whose report gives chrF / BLEU against fp32")
    if kind == ENCODER and cfg.pooling is None:
        raise QuantizeError(f"{src_dir} is an encoder without a pooling (hidden states only): "
                            "--max-loss-increase budgets the retrieval recall@10 of sentence "
                            "embeddings, which it has not; quantize it with a chosen mode, "
                            "whose report compares its hidden states")
    variants = list(DYNAMIC_VARIANTS)
    if kind == ENCODER:  # no lm_head to exclude or keep, no corpus windows to calibrate on
        variants = [(n, kw) for n, kw in variants if not _names_lm_head(QuantRecipe.request(
            **kw))]
    elif src.manifest.stage == "export" and kind != CLASSIFIER:
        variants += STATIC_VARIANTS
    tried: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, kw in variants:
            entry: dict[str, Any] = {"variant": name, "options": kw}
            try:
                out = quantize(src, Path(tmp) / name, data=data, **kw)
            except QuantizeError as e:
                tried.append({**entry, "error": str(e)})
                continue
            q = out.manifest  # what quantize wrote, without hashing its files again
            entry.update(cost=cost(q["accuracy"]), bytes=q["quantization"]["bytes"],
                         within_budget=cost(q["accuracy"]) <= max_loss_increase)
            tried.append(entry)
        fit = [t for t in tried if t.get("within_budget")]
        if not fit:
            raise QuantizeError(
                f"no variant is within max_loss_increase={max_loss_increase}: "
                + "; ".join(f"{t['variant']}: {t.get('cost', t.get('error'))}" for t in tried))
        latency = latency_ms({t["variant"]: Path(tmp) / t["variant"] / ONNX_FILE for t in fit},
                             cfg, kind)
        for t in fit:
            t["latency_ms"] = latency[t["variant"]]
        best = min(fit, key=lambda t: t["latency_ms"])
    objective = (f"median ms per forward of {check_tokens(cfg) // 2} tokens = check_tokens/2 "
                 "(batch 1, 2 threads)" if kind == ENCODER else "median ms per decode step "
                 f"(batch 1, past {check_tokens(cfg) // 2} = check_tokens/2, 2 threads)")
    search = {"max_loss_increase": max_loss_increase, "chosen": best["variant"],
              "objective": objective,
              "tried": tried}
    return quantize(src, out_dir, data=data, search=search, **best["options"])


def _names_lm_head(recipe: QuantRecipe) -> bool:
    return "lm_head" in (*recipe.exclude, *recipe.keep_8bit)


def latency_ms(paths: dict[str, str], cfg, kind: str, *, rounds: int = 200,
               threads: int = 2) -> dict[str, float]:
    """Median ms of one decode step (batch 1, one new token, past check_tokens(cfg) / 2: half
    the demo's context, whatever a model's own) per graph; for graphs without a cache, one
    forward of that many tokens."""
    past = check_tokens(cfg) // 2
    rng = np.random.default_rng(0)
    feeds = (random_feeds(cfg, kind, 1, 1, past, 0, rng) if kind == DECODER_WITH_PAST
             else random_feeds(cfg, kind, 1, past, 0, 0, rng))
    return session_latency_ms(paths, feeds, rounds=rounds, threads=threads)
