"""An 8-bit KV cache for the shared-cache graph (`tinyt optimize --target gqa --kv-cache int8`):
scales calibrated per layer on training text, written into every GroupQueryAttention node,
and the int8 graph checked against the float32-cache one before it is kept.

    fp32-cache graph ──run calibration windows──▶ max |key|, max |value| per layer, kv head and
        channel (keys: of each rotary pair) ──range (clip: mse | max x margin) / 127──▶
        k_scale, v_scale
    GQA(..., past_k, past_v, ...) ──▶ GQA(..., past_k int8, past_v int8, ..., k_scale, v_scale;
        k_quant_type = v_quant_type = PER_CHANNEL | PER_TENSOR, kv_cache_bit_width = 8)

What ONNX Runtime (1.32, CPU) does with it, checked against numpy (tests/export/
test_kv_int8.py): the new tokens' keys (after their rotary) and values are written to the
int8 buffer as clip(round(x / scale), -128, 127), and attention reads every cached token,
the new ones included, as int8 x scale. PER_CHANNEL takes kv_heads x head_dim scales (head
major), PER_TENSOR one. A step after 4,096 tokens reads a quarter of the bytes: the op alone at
Qwen3-0.6B's heads ran 2.1x faster per channel, 2.7x per tensor (benchmarks/results/
kv-int8-qwen3-0.6b-epyc-avx2).

The calibration: the float32-cache graph run over CALIBRATION_WINDOWS windows of the training
text; per layer, kv head and channel, max |x| (a key channel's: its rotary pair's largest norm,
sqrt(k_i^2 + k_{i+r/2}^2): the rotary turns each pair by an angle that grows with the position,
so a key at a position the calibration never reached can put the pair's whole norm into either
channel). A channel that was 0 throughout gets FLOOR of its tensor's range (a scale of 0 would
divide by zero). The range, and its scale range / 127, by KVCacheRecipe.clip:

- "mse" (the default): among CLIP_GRID x max |x|, the range whose int8 values are nearest the
  calibration's in squared error (least_error_ranges), the keys counted at positions drawn
  uniformly from the context (at_positions: the pair's angle at a position the calibration
  did not reach); per tensor, one fraction for the whole tensor. A range below the max
  trades the few largest values' clipping for a finer step for every other one. What the
  int8 cache costs in squared error is what moves attention: a key's error moves a score by
  q . dk, a value's the output by a . dv, each a sum of the channels' errors, so the sum of
  squared errors per channel is what a channel's range can lower.
- "max": max |x| x KVCacheRecipe.margin (1.25): nothing of the calibration clipped, a quarter
  of headroom for text unlike it.

On SmolLM2-135M (benchmarks/results/kv-int8-smollm2-epyc-vnni) "mse" took keys' ranges at
0.74-0.98 of the max (5th-95th percentile) and values' at 0.94-0.98, and the cache's squared
error (relative) 3.9e-5 for keys and 1.0e-4 for values against "max"'s 7.1e-5 and 1.7e-4.

The check's bound (kv_bound) follows the step: each cached element of the calibration moves by
at most `step` of its channel's max |x| (largest_step: half a level inside the range; the part
beyond it where the range clips, up to 1 - CLIP_GRID[0]). A value's error reaches the attention
output at that relative size; a key's moves a score q.k by at most that fraction of the largest
score its channels can make, with signs independent across the head_dim channels (sqrt(head_dim)
of one term, as compare.reorder_bound grows with a sum's width); every block adds its own and
the residual stream carries the earlier ones on (the blocks and the head, as reorder_bound's
depth). Relative to the logits' size, at least 1. It is an estimate of the worst case, not a
derivation (the independence is assumed), loose by one to two orders on real models: it
catches a wrong scale layout or axis, and the perplexity on held-out text is the measure.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tinyt.errors import SharedCacheError
from tinyt.graphio import CONTRIB_DOMAIN as MS
from tinyt.recipe import KVCacheRecipe

LEVELS = 127  # int8's symmetric levels each side
K_SCALE_INPUT, V_SCALE_INPUT = 12, 13  # GroupQueryAttention's input indices of the scales
CALIBRATION_WINDOWS = 4  # windows of the corpus' training split, never its validation
CALIBRATION_TOKENS = 2048  # tokens a window (at most the context)
FLOOR = 1e-3  # a silent channel's range, of its tensor's largest
CHECK_STEPS = 8  # greedy steps after each check prompt
CLIP_GRID = np.linspace(0.5, 1.0, 26)  # clip "mse": a channel's candidate ranges, fractions of
#                                        its max |x| (steps of 0.02; the least-error ones on
#                                        SmolLM2-135M: keys 0.74-0.98, values 0.94-0.98)


def kv_bound(cfg, step: float, magnitude: float) -> float:
    """The most an int8 cache whose elements move by at most `step` of their channel's max |x|
    (largest_step) may move logits of largest |value| `magnitude` from the float32 cache's
    (the module docstring's estimate)."""
    return (cfg.n_layer + 1) * step * float(np.sqrt(cfg.head_dim)) * max(magnitude, 1.0)


def calibration_rows(tokenizer, cfg, data: str | None) -> list[list[int]]:
    """CALIBRATION_WINDOWS windows of CALIBRATION_TOKENS (at most the context) of the corpus'
    training split (`data`: as quantize's; None: the built-in corpus), each begun as the
    model's sequences are."""
    return _windows(tokenizer, data, "train", CALIBRATION_WINDOWS,
                    min(CALIBRATION_TOKENS, cfg.block_size))


def check_rows(tokenizer, cfg, data: str | None) -> list[list[int]]:
    """Two prompts of the corpus' validation split (not the calibration's text), twice the
    calibration's length where the context allows: a key or value that only a later position
    makes (a rotary the calibration did not reach) shows there."""
    return _windows(tokenizer, data, "val", 2,
                    max(2, min(2 * CALIBRATION_TOKENS, cfg.block_size - CHECK_STEPS - 2)))


def _windows(tokenizer, data: str | None, split: str, count: int, length: int
             ) -> list[list[int]]:
    from tinyt import data as D

    corpus = D.load_corpus(data)
    tokens = D.encode_documents(tokenizer, getattr(corpus, split)[:200])
    length = min(length, max(len(tokens) - 2, 4) // 2)
    x, _ = D.lm_eval_windows(tokens, length, count, start=tokenizer.start_id)
    return [list(map(int, row)) for row in x]


def _rotary_layers(proto: onnx.ModelProto, cfg) -> dict[int, int]:
    """layer -> its rotated channels (the config's rotary_dims), for the layers whose
    GroupQueryAttention turns q and k (do_rotary; SmolLM3's no-rope layers do not)."""
    out = {}
    for node, layer in _gqa_nodes(proto):
        attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        if attrs.get("do_rotary"):
            out[layer] = cfg.rotary_dims
    return out


def _gqa_nodes(proto: onnx.ModelProto):
    for node in proto.graph.node:
        if node.op_type == "GroupQueryAttention" and node.domain == MS:
            yield node, int(node.output[1].split(".")[1])  # present.{i}.key


def _row_kv(lm, row: list[int], turns: dict[int, int]):
    """Per layer of the float32-cache model `lm` after the prompt `row`: (layer, keys, values
    [kv_heads, T, head_dim] float32, the keys' positions [T]) of the T tokens its cache holds."""
    cache = lm.new_cache(1, len(row))
    cache.prefill([row], lm.pad_id)
    for i in range(lm.config.n_layer):
        held = int(cache.wlens[0]) if i in cache.window_layers else len(row)
        k, v = (cache.kv[2 * i + j][0, :, :held].astype(np.float32) for j in (0, 1))
        yield i, k, v, np.arange(len(row) - held, len(row))  # a window keeps the last ones


def calibrate(lm, proto: onnx.ModelProto, rows: list[list[int]]) -> dict[int, list[np.ndarray]]:
    """Per layer, [max |key|, max |value|] per kv head and channel ([kv_heads, head_dim]) of
    the float32-cache model `lm` (a LanguageModel on the shared-cache graph `proto`) over the
    prompts `rows`, keys by their rotary pairs' norms."""
    turns = _rotary_layers(proto, lm.config)
    ranges: dict[int, list[np.ndarray]] = {}
    for row in rows:
        for i, k, v, _ in _row_kv(lm, row, turns):
            k, v = np.abs(k).astype(np.float64), np.abs(v).astype(np.float64)
            if i in turns:  # [kvh, T, hd]: each pair (c, c + r/2) by its norm
                r = turns[i]
                norm = np.hypot(k[..., : r // 2], k[..., r // 2: r])
                k = np.concatenate([norm, norm, k[..., r:]], axis=-1)
            now = [k.max(axis=1), v.max(axis=1)]  # [kvh, hd]
            ranges[i] = now if i not in ranges else [np.maximum(a, b)
                                                    for a, b in zip(ranges[i], now)]
    return ranges


def at_positions(k: np.ndarray, positions: np.ndarray, inv: np.ndarray, drawn: np.ndarray
                 ) -> np.ndarray:
    """Keys k [kv_heads, T, head_dim] whose first 2 x len(inv) channels were turned (rotary,
    halves) to `positions` by frequencies `inv`, turned to the positions `drawn` [T] instead."""
    h = len(inv)
    turn = (drawn - positions).astype(np.float64)[:, None] * inv.astype(np.float64)[None]
    c, s = np.cos(turn).astype(np.float32), np.sin(turn).astype(np.float32)
    a, b = k[..., :h], k[..., h:2 * h]
    return np.concatenate([a * c - b * s, b * c + a * s, k[..., 2 * h:]], axis=-1)


def _frequencies(cfg, layer: int) -> np.ndarray:
    """The rotary frequencies of `layer` (the windowed layers' own base where there is one;
    LongRoPE's short ones: the calibration's prompts are short)."""
    from tinyt.rope import local_rope_frequencies, rope_frequencies

    local = cfg.rope_local_theta is not None and cfg.windowed(layer)
    return local_rope_frequencies(cfg) if local else rope_frequencies(cfg)[0]


def squared_errors(x: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Sum over the tokens of (x - its int8 value)^2 per channel and candidate range: x
    [kv_heads, T, head_dim], candidates [kv_heads * head_dim, G] -> [kv_heads * head_dim, G],
    float64. As ONNX Runtime stores it: clip(round(x / scale), -128, 127) x scale."""
    x = x.transpose(0, 2, 1).reshape(candidates.shape[0], -1)
    out = np.empty(candidates.shape)
    for g in range(candidates.shape[1]):
        scale = (candidates[:, g:g + 1] / LEVELS).astype(np.float32)
        q = np.clip(np.round(x / scale), -LEVELS - 1, LEVELS) * scale
        out[:, g] = np.square(x - q, dtype=np.float64).sum(axis=1)
    return out


def least_error_ranges(lm, proto: onnx.ModelProto, rows: list[list[int]],
                       maxima: dict[int, list[np.ndarray]], recipe: KVCacheRecipe
                       ) -> dict[int, list[np.ndarray]]:
    """Per layer, [key range, value range] ([kv_heads, head_dim]) of least squared error of
    the int8 cache over the prompts `rows`, among CLIP_GRID x the channel's max |x| (`maxima`,
    calibrate's; per tensor: one fraction of the tensor's max for all). A key is counted at a
    position drawn uniformly from the context instead of its own (at_positions): a full
    cache holds every position, and a slow rotary pair reaches angles only late ones make."""
    turns, cfg = _rotary_layers(proto, lm.config), lm.config
    rng = np.random.default_rng(0)
    errors: dict[int, list[np.ndarray]] = {}
    bases = {i: [m.reshape(-1) if recipe.scales == "per-channel" else np.full(m.size, m.max())
                 for m in pair] for i, pair in maxima.items()}
    for row in rows:
        for i, k, v, pos in _row_kv(lm, row, turns):
            if i in turns:
                k = at_positions(k, pos, _frequencies(cfg, i)[: turns[i] // 2],
                                 rng.integers(0, cfg.block_size, len(pos)))
            now = [squared_errors(x, b[:, None] * CLIP_GRID[None]) for x, b in zip((k, v),
                                                                                  bases[i])]
            errors[i] = now if i not in errors else [a + b for a, b in zip(errors[i], now)]
    out = {}
    for i, pair in errors.items():
        got = []
        for e, base, m in zip(pair, bases[i], maxima[i]):
            if recipe.scales == "per-tensor":
                e = np.broadcast_to(e.sum(axis=0), e.shape)
            got.append((base * CLIP_GRID[e.argmin(axis=1)]).reshape(m.shape))
        out[i] = got
    return out


def kv_ranges(lm, proto: onnx.ModelProto, rows: list[list[int]], recipe: KVCacheRecipe
              ) -> tuple[dict[int, list[np.ndarray]], dict[int, list[np.ndarray]]]:
    """(ranges, maxima) per layer, [keys, values] [kv_heads, head_dim]: the calibration's max
    |x| (calibrate) and the ranges recipe.clip makes of them: "max", x recipe.margin; "mse",
    least_error_ranges."""
    maxima = calibrate(lm, proto, rows)
    if recipe.clip == "max":
        return {i: [m * recipe.margin for m in p] for i, p in maxima.items()}, maxima
    return least_error_ranges(lm, proto, rows, maxima, recipe), maxima


def largest_step(ranges: dict[int, list[np.ndarray]], maxima: dict[int, list[np.ndarray]]
                 ) -> float:
    """The most an int8 element of the calibration moves, as a fraction of its channel's max
    |x|: half a level inside the range, the part beyond it where the range clips."""
    worst = 0.0
    for i, pair in ranges.items():
        for r, m in zip(pair, maxima[i]):
            m = np.maximum(m, FLOOR * m.max())
            worst = max(worst, float(np.max(np.maximum(r / (2 * LEVELS), m - r) / m)))
    return worst


def scales(ranges: dict[int, list[np.ndarray]], recipe: KVCacheRecipe
           ) -> dict[int, list[np.ndarray]]:
    """Per layer, [k_scale, v_scale] as GroupQueryAttention takes them (float32; kv_heads x
    head_dim, head major, or one) of kv_ranges' ranges."""
    out = {}
    for layer, pair in ranges.items():
        got = []
        for r in pair:
            top = float(r.max())
            if not np.isfinite(top) or top <= 0:
                raise SharedCacheError(f"layer {layer}: the calibration's keys or values are "
                                       f"all 0 or not finite (max |x| {top}); no int8 range")
            r = np.maximum(r, FLOOR * top).reshape(-1) if recipe.scales == "per-channel" \
                else np.array([top])
            got.append((r / LEVELS).astype(np.float32))
        out[layer] = got
    return out


def to_int8_cache(proto: onnx.ModelProto, kv_scales: dict[int, list[np.ndarray]],
                  recipe: KVCacheRecipe) -> int:
    """Rewrite the shared-cache graph `proto` in place: every GroupQueryAttention reads and
    writes int8 buffers with its layer's scales. Returns the nodes rewritten."""
    g, done = proto.graph, 0
    for node, layer in _gqa_nodes(proto):
        if layer not in kv_scales:
            raise SharedCacheError(f"{node.name}: layer {layer} has no calibrated KV scales")
        inputs = list(node.input) + [""] * max(0, V_SCALE_INPUT + 1 - len(node.input))
        for at, kv, scale in zip((K_SCALE_INPUT, V_SCALE_INPUT), ("key", "value"),
                                 kv_scales[layer]):
            name = f"/model/layers.{layer}/attn/{kv}_cache_scale"
            g.initializer.append(onnx.numpy_helper.from_array(scale, name))
            inputs[at] = name
        node.input[:] = inputs
        node.attribute.extend([helper.make_attribute("k_quant_type", recipe.ort_quant_type),
                               helper.make_attribute("v_quant_type", recipe.ort_quant_type),
                               helper.make_attribute("kv_cache_bit_width", 8)])
        done += 1
    for value in list(g.input) + list(g.output):
        if value.name.startswith(("past_key_values.", "present.")):
            value.type.tensor_type.elem_type = TensorProto.INT8
    return done


def check_int8(fp32_lm, int8_lm, cfg, moved: float, rows: list[list[int]]) -> dict:
    """The int8-cache model against the float32-cache one: each prompt of `rows` (the corpus'
    validation split), then CHECK_STEPS greedy steps of the float32 model fed to both; their
    last-position logits held to kv_bound of the calibration's largest_step `moved`.
    SharedCacheError past it."""
    worst = size = 0.0
    same = total = 0
    for row in rows:
        a, b = (lm.new_cache(1, len(row) + CHECK_STEPS + 1) for lm in (fp32_lm, int8_lm))
        la, lb = a.prefill([row], fp32_lm.pad_id)[0, 0].copy(), \
            b.prefill([row], int8_lm.pad_id)[0, 0].copy()
        for step in range(CHECK_STEPS + 1):
            worst = max(worst, float(np.abs(la - lb).max()))
            size = max(size, float(np.abs(la).max()))
            same, total = same + int(la.argmax() == lb.argmax()), total + 1
            if step == CHECK_STEPS:
                break
            nxt = np.array([la.argmax()])
            la, lb = a.step(nxt, None)[0, 0].copy(), b.step(nxt, None)[0, 0].copy()
    bound = kv_bound(cfg, moved, size)
    if not worst <= bound:
        raise SharedCacheError(f"the int8 KV cache moves the logits by {worst:.3g} from the "
                               f"float32 cache's (allowed {bound:.3g}: elements moved by up "
                               f"to {moved:.3g} of their channel's range, {cfg.n_layer} "
                               f"layers, head_dim "
                               f"{cfg.head_dim}, logits up to {size:.3g}); calibrate on text "
                               "like the model's, or keep --kv-cache float32")
    return {"logits_max_abs": worst, "logits_magnitude": size, "tolerance": bound,
            "top1_agreement": same / total, "prompts": len(rows),
            "tokens": sum(map(len, rows)) + len(rows) * CHECK_STEPS}


def write_int8(path: Path, kv_scales: dict[int, list[np.ndarray]],
               recipe: KVCacheRecipe) -> None:
    """The graph at `path` rewritten in place (to_int8_cache)."""
    from tinyt.graphio import load_graph, save_graph

    proto = load_graph(path)
    to_int8_cache(proto, kv_scales, recipe)
    save_graph(proto, path)
