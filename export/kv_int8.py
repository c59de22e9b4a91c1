"""An 8-bit KV cache for the shared-cache graph (`tinyt optimize --target gqa --kv-cache int8`):
scales calibrated per layer on training text, written into every GroupQueryAttention node,
and the int8 graph checked against the float32-cache one before it is kept.

    fp32-cache graph ──run calibration windows──▶ max |key|, max |value| per layer, kv head and
        channel (keys: of each rotary pair) ──× margin / 127──▶ k_scale, v_scale
    GQA(..., past_k, past_v, ...) ──▶ GQA(..., past_k int8, past_v int8, ..., k_scale, v_scale;
        k_quant_type = v_quant_type = PER_CHANNEL | PER_TENSOR, kv_cache_bit_width = 8)

What ONNX Runtime (1.32, CPU) does with it, checked against numpy (tests/export/
test_kv_int8.py): the new tokens' keys (after their rotary) and values are written to the
int8 buffer as clip(round(x / scale), -128, 127), and attention reads every cached token,
the new ones included, as int8 x scale. PER_CHANNEL takes kv_heads x head_dim scales (head
major), PER_TENSOR one. A step after 4,096 tokens reads a quarter of the bytes: the op alone at
Qwen3-0.6B's heads ran 2.1x faster per channel, 2.7x per tensor (benchmarks/results/
kv-int8-qwen3-0.6b-epyc-avx2).

The calibration rule: the range of a channel is max |x| over the calibration windows times
KVCacheRecipe.margin (1.25), and its scale that range / 127; a value beyond it at run time is
clipped. A key channel's range is its rotary pair's largest norm, sqrt(k_i^2 + k_{i+r/2}^2):
the rotary turns each pair by an angle that grows with the position, so a key at a position
the calibration never reached can put the pair's whole norm into either channel; ranges of
the pair's norm cover every position. A channel that was 0 throughout gets FLOOR of its
tensor's range (a scale of 0 would divide by zero).

The bound (kv_bound) follows the step: each cached element moves by at most half a level,
margin / 254 of its channel's range. A value's error reaches the attention output at that
relative size; a key's moves a score q.k by at most that fraction of the largest score its
channels can make, with signs independent across the head_dim channels (sqrt(head_dim) of one
term, as compare.reorder_bound grows with a sum's width); every block adds its own and the
residual stream carries the earlier ones on (the blocks and the head, as reorder_bound's
depth). Relative to the logits' size, at least 1.
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
CALIBRATION_TOKENS = 1024  # tokens a window (at most the context)
FLOOR = 1e-3  # a silent channel's range, of its tensor's largest
CHECK_STEPS = 8  # greedy steps after each check prompt


def kv_bound(cfg, recipe: KVCacheRecipe, magnitude: float) -> float:
    """The most an int8 cache may move logits of largest |value| `magnitude` from the float32
    cache's (the module docstring derives it)."""
    step = recipe.margin / (2 * LEVELS)
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


def calibrate(lm, proto: onnx.ModelProto, rows: list[list[int]]) -> dict[int, list[np.ndarray]]:
    """Per layer, [max |key|, max |value|] per kv head and channel ([kv_heads, head_dim]) of
    the float32-cache model `lm` (a LanguageModel on the shared-cache graph `proto`) over the
    prompts `rows`, keys by their rotary pairs' norms."""
    turns = _rotary_layers(proto, lm.config)
    ranges: dict[int, list[np.ndarray]] = {}
    for row in rows:
        cache = lm.new_cache(1, len(row))
        cache.prefill([row], lm.pad_id)
        for i in range(lm.config.n_layer):
            held = int(cache.wlens[0]) if i in cache.window_layers else len(row)
            k, v = (np.abs(cache.kv[2 * i + j][0, :, :held]).astype(np.float64) for j in (0, 1))
            if i in turns:  # [kvh, T, hd]: each pair (c, c + r/2) by its norm
                r = turns[i]
                norm = np.hypot(k[..., : r // 2], k[..., r // 2: r])
                k = np.concatenate([norm, norm, k[..., r:]], axis=-1)
            now = [k.max(axis=1), v.max(axis=1)]  # [kvh, hd]
            ranges[i] = now if i not in ranges else [np.maximum(a, b)
                                                    for a, b in zip(ranges[i], now)]
    return ranges


def scales(ranges: dict[int, list[np.ndarray]], recipe: KVCacheRecipe
           ) -> dict[int, list[np.ndarray]]:
    """Per layer, [k_scale, v_scale] as GroupQueryAttention takes them (float32; kv_heads x
    head_dim, head major, or one)."""
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
            got.append((recipe.margin * r / LEVELS).astype(np.float32))
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


def check_int8(fp32_lm, int8_lm, cfg, recipe: KVCacheRecipe, rows: list[list[int]]) -> dict:
    """The int8-cache model against the float32-cache one: each prompt of `rows` (the corpus'
    validation split), then CHECK_STEPS greedy steps of the float32 model fed to both; their
    last-position logits held to kv_bound. SharedCacheError past it."""
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
    bound = kv_bound(cfg, recipe, size)
    if not worst <= bound:
        raise SharedCacheError(f"the int8 KV cache moves the logits by {worst:.3g} from the "
                               f"float32 cache's (allowed {bound:.3g}: half an int8 level of "
                               f"each channel's range, {cfg.n_layer} layers, head_dim "
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
