"""Graph-vs-graph equivalence (torch-free): run two ONNX models on the same inputs over a grid
of shapes and report the worst difference per output. Used by the optimize stage (and later
ones) to check its own output against its input."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort

from tinyt.config import ModelConfig
from tinyt.contract import DECODER_WITH_PAST, kv_shape, past_names
from tinyt.runtime.feeds import check_tokens, prefill_feeds, step_feeds, window_tokens
from tinyt.runtime.fixed import FixedWindow

# Two fp32 computations of the same function in other orders (a fused or folded graph against
# its input, ONNX Runtime against PyTorch): where do they part? A sum of K terms of random sign
# rounded in another order moves by ~sqrt(K)·u of the sum's size (u = 2^-24, fp32's unit
# roundoff); each of the L blocks adds such a relative error to the residual stream, and the
# next ones carry it on, so an output of size M moves by ~L·sqrt(K)·u·M, K the widest reduction
# (the model's width, its MLP's, or the check's sequence for attention). Measured on real
# weights: SmolLM2-135M (L 30, K 1,536, logits up to ~40) optimized vs exported 3.3e-3 = 1.2x
# that estimate; random-weight graphs sit below it. REORDER_SAFETY covers the amplification of
# norms, softmax and gated MLPs on top of it; a wrong rewrite (a mask, a rotary table, a
# window) moves outputs by a good fraction of M, far beyond.
FP32_U = 2.0 ** -24
REORDER_SAFETY = 16.0
# Greedy tokens: two implementations each within the bound of the truth can order two logits
# closer than twice the bound either way (a tie).
TIE_FACTOR = 2.0
# Outputs near zero (a random-weight model's logits ~1e-2) are still computed from hidden
# states of size ~1: the bound's magnitude is never taken below this.
MAGNITUDE_FLOOR = 1.0


def reduction_width(cfg: ModelConfig) -> int:
    """K of reorder_bound: the longest sum of products in one block or the head."""
    return max(cfg.n_embd, cfg.n_inner or 4 * cfg.n_embd, check_tokens(cfg))


def reorder_bound(cfg: ModelConfig, magnitude: float, layers: int | None = None) -> float:
    """The largest difference two fp32 orders of the same computation may show on an output
    whose largest |value| is `magnitude` (the reference's), for this model's depth and width.
    layers: the blocks the output passes through, if not n_layer (an encoder-decoder's logits
    pass through both stacks)."""
    depth = max(cfg.n_layer if layers is None else layers, 1) + 1  # the blocks and the head
    scale = max(float(magnitude), MAGNITUDE_FLOOR)
    return REORDER_SAFETY * FP32_U * depth * float(np.sqrt(reduction_width(cfg))) * scale


def within_bound(cfg: ModelConfig, worst: dict[str, dict]) -> dict[str, dict]:
    """Each output's bound beside its worst difference (`worst` as compare_graphs returns it,
    with the reference's largest |value| as "magnitude"); returns the outputs beyond it."""
    for w in worst.values():
        w["bound"] = reorder_bound(cfg, w.get("magnitude", 0.0))
    return {n: w for n, w in worst.items() if not w["max_abs"] <= w["bound"]}


def grid(cfg: ModelConfig, kind: str) -> list[tuple[int, ...]]:
    """(batch, sequence, past, left padding of row 0[, first position]) cases, ends of every
    range included: sequences of at most T = check_tokens(cfg) tokens (past + new), whatever
    the context; where the context is longer and the graph takes positions, two cases with a
    short past placed at the context's end (positions up to block_size - 1)."""
    T = check_tokens(cfg)
    cases: list[tuple[int, ...]] = [
        (1, 1, 0, 0), (2, min(7, T), 0, 0), (3, T, 0, min(5, T - 1)), (1, 1, T - 1, 0),
        (4, 1, min(60, T - 1), 3 if T > 4 else 0), (2, min(5, T // 2), T // 2, 0)]
    if kind != DECODER_WITH_PAST:
        cases = [(b, s + p, 0, pad) for b, s, p, pad in cases]
    elif cfg.block_size > T:
        cases += [(1, 1, 9, 0, cfg.block_size - 10), (3, 7, 9, 2, cfg.block_size - 16)]
    if (W := window_tokens(cfg)) is not None:  # past a window longer than T: batch 1
        cases += [(1, W, 0, 0)] + ([(1, 4, W - 4, 0)] if kind == DECODER_WITH_PAST else [])
    return sorted(set(cases))


CASE_KEYS = ("batch", "sequence", "past", "padding", "first_position")


def grid_sizes(cfg: ModelConfig, cases) -> dict[str, int]:
    """What a grid runs, for a stage's report: the longest sequence (past + new tokens), the
    model's context, the highest position reached and the largest batch."""
    return {"longest_sequence": max(c[1] + c[2] for c in cases), "context": cfg.block_size,
            "highest_position": max(c[1] + c[2] - 1 + (c[4] if len(c) > 4 else 0)
                                    for c in cases),
            "batch": max(c[0] for c in cases)}


def random_feeds(cfg: ModelConfig, kind: str, b: int, s: int, p: int, pad: int,
                 rng: np.random.Generator, first: int = 0) -> dict[str, np.ndarray]:
    """Feeds for a batch of b, s new tokens after a random past of p, row 0 left-padded, the
    first token at position `first`."""
    mask = np.ones((b, p + s), dtype=np.int64)
    mask[0, :pad] = 0
    feeds = {"input_ids": rng.integers(0, cfg.vocab_size, (b, s), dtype=np.int64),
             "attention_mask": mask}
    if cfg.task != "causal_lm" and cfg.type_vocab_size >= 2:  # encoders', classifiers' types
        feeds["token_type_ids"] = rng.integers(0, cfg.type_vocab_size, (b, s), dtype=np.int64)
    if kind == DECODER_WITH_PAST:
        feeds["position_ids"] = np.clip(mask.cumsum(-1) - 1, 0, None)[:, p:] + first
        for name in past_names(cfg.n_layer):
            feeds[name] = rng.standard_normal(kv_shape(cfg, b, p)).astype(np.float32)
    return feeds


CHUNK_VALUES = 1 << 22  # values per chunk when comparing or reducing big outputs (4 M)


def row_chunks(*arrays: np.ndarray):
    """The arrays viewed as rows of their last axis, in aligned chunks of about CHUNK_VALUES
    values: a [3, 1024, 50257] logits tensor is compared in 100 MB pieces, not as float64
    copies of 1.2 GB each."""
    flat = [a.reshape(-1, a.shape[-1] if a.ndim else 1) for a in arrays]  # same row count
    step = max(1, CHUNK_VALUES // max(flat[0].shape[1], 1))
    for i in range(0, flat[0].shape[0], step):
        yield tuple(f[i:i + step] for f in flat)


def max_abs_diff(x: np.ndarray, y: np.ndarray) -> float:
    """max |x - y| in float64, chunk by chunk (NaN propagates)."""
    worst = 0.0
    for a, b in row_chunks(x, y):
        d = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0.0))
        if not d <= worst:
            worst = d
    return worst


def max_abs(x: np.ndarray) -> float:
    """max |x|, chunk by chunk."""
    return max((float(np.abs(a).max(initial=0.0)) for (a,) in row_chunks(x)), default=0.0)


def compare_graphs(a: Callable[[], ort.InferenceSession], b: Callable[[], ort.InferenceSession],
                   cfg: ModelConfig, kind: str, *, seed: int = 0, cases=None) -> dict[str, Any]:
    """Worst max-abs difference per output (and where) between the sessions that a and b
    open, over `cases` of (batch, sequence, past, padding[, first position]) — by default
    grid(cfg, kind). a's session runs every case and is closed before b opens, so only one
    graph's weights are held at a time (at the
    Llama-3.2-1B shape the two fp32 sessions together held 9.4 GB of optimize's 19.2 GB
    peak)."""
    rng = np.random.default_rng(seed)
    cases = list(grid(cfg, kind) if cases is None else cases)
    feeds = [random_feeds(cfg, kind, *case[:4], rng, first=case[4] if len(case) > 4 else 0)
             for case in cases]
    first = a()
    names = [o.name for o in first.get_outputs()]
    expected = [first.run(names, f) for f in feeds]
    del first
    second = b()
    worst: dict[str, Any] = {n: {"max_abs": 0.0, "case": None, "magnitude": 0.0}
                             for n in names}
    for case, f, xs in zip(cases, feeds, expected):
        for name, x, y in zip(names, xs, second.run(names, f)):
            if x.shape != y.shape:
                raise ValueError(f"{name}: shape {x.shape} vs {y.shape} at {case}")
            d = max_abs_diff(x, y)
            size = max_abs(x)
            if not d <= worst[name]["max_abs"]:  # NaN counts as worse than anything
                worst[name].update(max_abs=d, case=dict(zip(CASE_KEYS, case)))
            worst[name]["magnitude"] = max(worst[name]["magnitude"], size)
    return worst


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Where two token lists first differ (over their common length), or None."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def ort_greedy(sess, cfg: ModelConfig, kind: str, prompt: list[int], steps: int,
               fixed: dict[str, int] | None = None, vocab_limit: int | None = None) -> list[int]:
    """Greedy decoding through the ONNX graph (with its KV cache when it has one; through a
    window of fixed size when its shapes are pinned); ids from vocab_limit on are never
    chosen (a vocabulary padded beyond its tokenizer)."""
    if fixed:
        window = FixedWindow(sess, cfg, kind, fixed, 1)
        logits = window.feed(np.asarray([prompt], dtype=np.int64), np.ones((1, len(prompt)),
                                                                           dtype=np.int64))
        out = [int(logits[0, :vocab_limit].argmax())] if steps else []
        while len(out) < steps:  # the last token is chosen, never fed: it may fill the window
            logits = window.feed(np.asarray([out[-1:]]), np.ones((1, 1), dtype=np.int64))
            out.append(int(logits[0, :vocab_limit].argmax()))
        return out
    return _greedy_rows(sess, cfg, kind, [prompt], steps, vocab_limit)[0]


GREEDY_LOGITS = 1 << 26  # logits of one batched prefill, at most (256 MB of float32)


def ort_greedy_rows(sess, cfg: ModelConfig, kind: str, prompts: list[list[int]], steps: int,
                    vocab_limit: int | None = None) -> list[list[int]]:
    """ort_greedy for each prompt, prompts of one length decoded together as the rows of a
    batch (of at most GREEDY_LOGITS prefill logits): each step reads the weights once for
    every row. Only for a graph whose rows are independent of each other (fp32, weight-only
    or per-row quantized activations: a per-tensor activation scale would couple them); the
    tokens are then each prompt's alone, up to the float32 rounding of another GEMM blocking."""
    if len({len(p) for p in prompts}) != 1:
        return [ort_greedy(sess, cfg, kind, p, steps, vocab_limit=vocab_limit) for p in prompts]
    # a graph without a cache runs the whole sequence again each step: its logits grow to
    # prompt + steps positions
    positions = len(prompts[0]) + (steps if kind != DECODER_WITH_PAST else 0)
    rows = max(1, GREEDY_LOGITS // (positions * cfg.vocab_size))
    return [t for i in range(0, len(prompts), rows)
            for t in _greedy_rows(sess, cfg, kind, prompts[i:i + rows], steps, vocab_limit)]


def _greedy_rows(sess, cfg: ModelConfig, kind: str, prompts: list[list[int]], steps: int,
                 vocab_limit: int | None) -> list[list[int]]:
    names = [o.name for o in sess.get_outputs()]
    feeds = prefill_feeds(cfg, kind, np.asarray(prompts, dtype=np.int64))
    out = np.zeros((len(prompts), steps), dtype=np.int64)
    for t in range(steps):
        outputs = sess.run(names, feeds)
        out[:, t] = outputs[0][:, -1, :vocab_limit].argmax(-1)
        feeds = step_feeds(kind, feeds, out[:, t], names, outputs)
    return out.tolist()
