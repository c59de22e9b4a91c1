"""The rotary tables of the shared-cache graph (export/gqa_graph.py): GroupQueryAttention's
cos and sin caches, computed in the graph from the frequencies alone (ONNX Runtime folds them at
load), one table or two (Gemma 3's windowed layers' base), and LongRoPE's short and long tables
chosen per call. Torch-free apart from onnx.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tinyt.rope import is_longrope, longrope_original, rope_table


def rope_cache(cfg, local: bool = False, long: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [block_size, rotary_dims / 2] of the rotary angles, as tinyt.model computes
    them in float32 (tinyt.rope's scaled frequencies; yarn's attention factor is in the
    attention's scale, which the rewrite copies from MultiHeadAttention; LongRoPE's short and
    long tables (`long`) hold its attention factor, which scales the rotated dims alone).
    What the graph's table nodes (_rope_table_nodes) compute, within an ulp of cos / sin."""
    return rope_table(cfg, cfg.block_size, scaled=is_longrope(cfg), local=local, long=long)


def _rope_table_nodes(g: onnx.GraphProto, names: tuple[str, str], cfg, *, local: bool = False,
                      long: bool = False) -> list[onnx.NodeProto]:
    """Nodes computing rope_cache's cos and sin into `names` from the frequencies alone:

        Range(0, block_size) ─Unsqueeze─ Mul(inv_freq) ─┬─ Cos [─ Mul(factor)] ─▶ cos table
                                                        └─ Sin [─ Mul(factor)] ─▶ sin table

    Every input is a constant, so ONNX Runtime folds them into the tables when it loads the
    graph (any optimization level but 'disabled'): the file holds rotary_dims / 2 floats, not
    2 x block_size x rotary_dims / 2 (64 MiB at 131,072 positions and head_dim 128, twice
    where the windowed layers have a base of their own, as Gemma 3's: 67 MB a graph at its
    32,768)."""
    from tinyt.rope import local_rope_frequencies, rope_frequencies

    inv, factor = (local_rope_frequencies(cfg), 1.0) if local else \
        rope_frequencies(cfg, long=long)
    if not is_longrope(cfg):
        factor = 1.0  # yarn's factor is in the attention's scale (rope_cache's scaled=False)
    pre = names[0].rsplit("/", 1)[0] + ("/long" if long else "/short" if is_longrope(cfg)
                                        else "")
    consts = {f"{pre}/start": np.array(0, np.float32),
              f"{pre}/limit": np.array(cfg.block_size, np.float32),
              f"{pre}/delta": np.array(1, np.float32),
              f"{pre}/axis": np.array([1], np.int64),
              f"{pre}/inv_freq": inv.astype(np.float32)[None, :]}
    nodes = [helper.make_node("Range", [f"{pre}/start", f"{pre}/limit", f"{pre}/delta"],
                              [f"{pre}/positions"], name=f"{pre}/Range"),
             helper.make_node("Unsqueeze", [f"{pre}/positions", f"{pre}/axis"],
                              [f"{pre}/positions2"], name=f"{pre}/Unsqueeze"),
             helper.make_node("Mul", [f"{pre}/positions2", f"{pre}/inv_freq"], [f"{pre}/angles"],
                              name=f"{pre}/Mul_angles")]
    if factor != 1.0:
        consts[f"{pre}/factor"] = np.array(factor, np.float32)
    for op, out in zip(("Cos", "Sin"), names):
        raw = out if factor == 1.0 else f"{out}/unscaled"
        nodes.append(helper.make_node(op, [f"{pre}/angles"], [raw], name=f"{out}/{op}"))
        if factor != 1.0:
            nodes.append(helper.make_node("Mul", [raw, f"{pre}/factor"], [out],
                                          name=f"{out}/Mul_factor"))
    g.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in consts.items())
    return nodes


ROPE_CACHES = {False: ("/rotary/cos_cache", "/rotary/sin_cache"),
               True: ("/rotary/local/cos_cache", "/rotary/local/sin_cache")}


def rope_caches(g: onnx.GraphProto, cfg) -> dict[int, tuple[str, str]]:
    """Each rotary layer's (cos, sin) table names, the tables added to the graph: one table,
    or two where rope_local_theta gives the windowed layers their own base."""
    which = {i: cfg.rope_local_theta is not None and cfg.windowed(i)
             for i in range(cfg.n_layer) if cfg.rotary_layer(i)}
    if is_longrope(cfg):  # one table or the other by the batch's longest sequence
        _longrope_caches(g, cfg)
        return {i: ROPE_CACHES[False] for i in which}
    nodes = [n for local in sorted(set(which.values()))
             for n in _rope_table_nodes(g, ROPE_CACHES[local], cfg, local=local)]
    for k, node in enumerate(nodes):
        g.node.insert(k, node)
    return {i: ROPE_CACHES[local] for i, local in which.items()}


LONGROPE_POSITIONS = "/rotary/longrope/position_ids"  # GroupQueryAttention's rows of the tables


def _longrope_caches(g: onnx.GraphProto, cfg) -> None:
    """LongRoPE's tables chosen per call, as tinyt.model chooses its frequencies (the longest
    position + 1, here GroupQueryAttention's total_sequence_length, past the original
    context: the long ones). Both tables are one constant, the short above the long, and the
    choice is which half the positions index: block_size is added to every position past the
    original context. (A Where choosing one table or the other made a copy of the chosen one
    each run: 2 x 131,072 x 48 floats at Phi-4-mini's context, 13.7 ms of a 29 ms step.)

        short cos ─┐                                                      (folded at load)
        long cos ──┴─Concat─▶ cos_cache [2 x block_size, rotary_dims / 2]   (sin the same)
        total_sequence_length ─Greater(original)─Cast─Mul(block_size)─┐
        position_ids ───────────────────────────────────────────────Add─▶ LONGROPE_POSITIONS"""
    original = longrope_original(cfg)
    pre = "/rotary/longrope"
    cond = f"{pre}/past_original"
    nodes = [helper.make_node("Greater", ["total_sequence_length", f"{pre}/original"],
                              [cond], name=f"{pre}/Greater"),
             helper.make_node("Cast", [cond], [f"{pre}/past_original_i64"], name=f"{pre}/Cast",
                              to=TensorProto.INT64),
             helper.make_node("Mul", [f"{pre}/past_original_i64", f"{pre}/block_size"],
                              [f"{pre}/offset"], name=f"{pre}/Mul"),
             helper.make_node("Add", ["position_ids", f"{pre}/offset"], [LONGROPE_POSITIONS],
                              name=f"{pre}/Add")]
    g.initializer.extend([
        onnx.numpy_helper.from_array(np.array(original, np.int32), f"{pre}/original"),
        onnx.numpy_helper.from_array(np.array(cfg.block_size, np.int64), f"{pre}/block_size")])
    for long in (False, True):
        nodes += _rope_table_nodes(g, tuple(f"{n}/{'long' if long else 'short'}"
                                            for n in ROPE_CACHES[False]), cfg, long=long)
    for name in ROPE_CACHES[False]:
        nodes.append(helper.make_node("Concat", [f"{name}/short", f"{name}/long"], [name],
                                      name=f"{name}/Concat", axis=0))
    for k, node in enumerate(nodes):
        g.node.insert(k, node)
