"""The shared-cache graph rewrite: MultiHeadAttention with past/present becomes
GroupQueryAttention on one buffer per layer (runtime/cache.py has the I/O and why).

Per layer, from the graph `tinyt optimize --target cpu` makes (fp32 or quantized):

    x ─MatMul(W_qkv)─ qkv ─Split─ q, k, v ─▶ MHA(q, k, v, bias, mask, past_k, past_v)
                                                 ─▶ out, present.i.key, present.i.value
to
    x ─MatMul(W_qkv)─ qkv ─Add(bias)─▶ GQA(qkv packed, past_k, past_v, seqlens_k,
                                            total_sequence_length, query_seqlens)
                                                 ─▶ out, present.i.key, present.i.value

the attention-mask subgraph goes (GroupQueryAttention is causal over each row's own
tokens), and the lm_head reads one position per row:

    hidden [B, S, C] ─GatherND(query_seqlens - 1, batch_dims=1)─Unsqueeze─ [B, 1, C] ─lm_head─▶

The rewrite only (torch-free apart from onnx); export/shared_cache.py is the stage that writes
it as an artifact, export/shared_cache_checks.py what it is checked against.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from tinyt.contract import (
    CAPACITY,
    HEAD_INPUT,
    HIDDEN_OUTPUT,
    WINDOW_CAPACITY,
    WINDOW_INPUTS,
    compact_window_layers,
)
from tinyt.errors import SharedCacheError
from tinyt.graphio import CONTRIB_DOMAIN as MS
from tinyt.rope import attention_scale, is_longrope

from .gqa_rotary import LONGROPE_POSITIONS, rope_caches
from .kvfuse import drop_dead, producers

GQA_INPUTS = (("seqlens_k", TensorProto.INT32, ["batch_size"]),
              ("total_sequence_length", TensorProto.INT32, []),
              ("query_seqlens", TensorProto.INT32, ["batch_size"]))
QUERY_SEQLENS_INPUT = 16  # GroupQueryAttention's input index of query_seqlens (ORT >= 1.2x)
POSITION_IDS_INPUT = 9  # ... of position_ids (its rotary positions, in place of seqlens_k's)
ROTARY_HEAD_MULTIPLE = 16  # GroupQueryAttention's CPU rotary: head_size % 16 == 0


def _lengths(cfg, layer: int) -> list[str]:
    """A layer's seqlens_k and total_sequence_length inputs: the window's own for a layer whose
    buffer holds the window alone (tinyt.contract.compact_window_layers)."""
    if layer in compact_window_layers(cfg):
        return list(WINDOW_INPUTS)
    return ["seqlens_k", "total_sequence_length"]


def to_gqa(proto: onnx.ModelProto, cfg) -> int:
    """Rewrite `proto` in place (see the module docstring); returns the layers rewritten."""
    if cfg.pos_encoding == "rotary" or cfg.kv_heads != cfg.n_head:
        done = _cache_outside_attention_to_gqa(proto, cfg)
    else:
        done = _mha_with_past_to_gqa(proto, cfg)
    g = proto.graph
    _unfuse_skip_layernorm(g)
    _last_position_logits(g, cfg.n_embd)
    _drop_unused(g)
    _retype_io(g, cfg)
    return done


def _mha_with_past_to_gqa(proto: onnx.ModelProto, cfg) -> int:
    g, n_head = proto.graph, cfg.n_head
    prod = producers(g)
    nodes, done = [], 0
    for node in g.node:
        if not (node.op_type == "MultiHeadAttention" and node.domain == MS
                and len(node.input) >= 8 and node.input[6] and node.input[7]):
            nodes.append(node)
            continue
        split = prod.get(node.input[0])
        if split is None or split.op_type != "Split" \
                or list(split.output) != list(node.input[:3]):
            raise SharedCacheError(f"{node.name}: q, k, v do not come from one Split of a packed "
                                   "projection; only graphs from `tinyt optimize --target cpu`")
        qkv, bias = split.input[0], node.input[3]
        if bias:
            nodes.append(helper.make_node("Add", [qkv, bias], [f"{qkv}_biased"],
                                          name=f"{node.name}/qkv_bias/Add"))
            qkv = f"{qkv}_biased"
        layer = int(node.output[1].split(".")[1])  # present.{i}.key
        inputs = [qkv, "", "", node.input[6], node.input[7], *_lengths(cfg, layer)]
        inputs += [""] * (QUERY_SEQLENS_INPUT - len(inputs)) + ["query_seqlens"]
        nodes.append(helper.make_node(
            "GroupQueryAttention", inputs, list(node.output[:3]), domain=MS,
            name=node.name.replace("MultiHeadAttention", "GroupQueryAttention") or None,
            num_heads=n_head, kv_num_heads=n_head,
            **_attention_attrs(cfg, _mha_scale(node), layer)))
        done += 1
    del g.node[:]
    g.node.extend(nodes)
    return done


def _upstream(name: str, prod: dict, stop) -> onnx.NodeProto | None:
    """The first producer up the chain of first inputs from `name` for which stop(node)."""
    for _ in range(16):
        node = prod.get(name)
        if node is None or stop(node):
            return node
        name = node.input[0]
    return None


def _cache_outside_attention_to_gqa(proto: onnx.ModelProto, cfg) -> int:
    """The Llama form after `optimize --target cpu`: the cache grows by Concat outside
    MultiHeadAttention, after RotaryEmbedding, and grouped heads are repeated out to it:

        x ─MatMul─ qkv ─Split─┬ q ─RotaryEmbedding──────────────────────────────────┐
                              ├ k ─Reshape─Transpose─RotaryEmbedding─┐              │
                              │          past_k ─Concat─▶ present.i.key ─(repeat)─▶ MHA ─▶ out
                              └ v ─Reshape─Transpose─ past_v ─Concat─▶ present.i.value ┘
    to
        x ─MatMul─ qkv ─▶ GQA(qkv packed, past_k, past_v, seqlens_k, total_sequence_length,
                              cos_cache, sin_cache, query_seqlens; do_rotary, kv_num_heads)
                             ─▶ out, present.i.key, present.i.value

    GroupQueryAttention rotates q and k itself, at each row's own positions (the tokens
    already in its cache, then one more per token of the chunk)."""
    g = proto.graph
    prod = producers(g)
    rotary = cfg.pos_encoding == "rotary"
    for what, size in (("head_dim", cfg.head_dim), ("rotary_dim", cfg.rotary_dims)):
        if rotary and size % ROTARY_HEAD_MULTIPLE:  # rotary_dim: its table's half, of 8
            raise SharedCacheError(f"{what}={size}: GroupQueryAttention's rotary kernel (ONNX "
                                   f"Runtime {ort.__version__}, CPU) needs a multiple of "
                                   f"{ROTARY_HEAD_MULTIPLE}; the contract graph runs this model")
    caches = rope_caches(g, cfg) if rotary else {}
    replaced, nodes, done = set(), {}, 0
    for site in _attention_sites(g, prod, cfg):
        node = site.anchor
        # the packed projection's Split of q, k, v (partial rotary splits q in two on the way)
        split = _upstream(site.query, prod, lambda n: n.op_type == "Split" and len(n.output) == 3)
        concat = _upstream(site.key, prod, lambda n: n.output[0].startswith("present."))
        if split is None or len(split.output) != 3 or concat is None \
                or concat.op_type != "Concat" or not concat.output[0].endswith(".key"):
            raise SharedCacheError(f"{node.name}: attention is not fed by one Split of a packed "
                                   "q, k, v projection and a cache Concat; only graphs from "
                                   "`tinyt optimize --target cpu`")
        layer = concat.output[0].split(".")[1]
        past = [f"past_key_values.{layer}.{kv}" for kv in ("key", "value")]
        present = [f"present.{layer}.{kv}" for kv in ("key", "value")]
        replaced.update(present)
        i = int(layer)
        turn = i in caches
        qkv, before = [split.input[0], "", ""], []
        if cfg.qk_norm:  # q and k after their norms, v as it is: three inputs, not one packed
            qkv, before = _normed_qkv(g, split, i, whole=cfg.qk_norm == "projection")
        inputs = [*qkv, *past, *_lengths(cfg, i)]
        inputs += caches[i] if turn else ["", ""]
        if turn and is_longrope(cfg):  # the positions pick the short or the long table
            inputs += [""] * (POSITION_IDS_INPUT - len(inputs)) + [LONGROPE_POSITIONS]
        elif turn and i in compact_window_layers(cfg):  # its buffer's slots are not positions
            inputs += [""] * (POSITION_IDS_INPUT - len(inputs)) + ["position_ids"]
        inputs += [""] * (QUERY_SEQLENS_INPUT - len(inputs)) + ["query_seqlens"]
        attrs = dict(num_heads=cfg.n_head, kv_num_heads=cfg.kv_heads, do_rotary=int(turn),
                     rotary_interleaved=0, **_attention_attrs(cfg, site.scale, i))
        nodes[id(node)] = [*before, helper.make_node(
            "GroupQueryAttention", inputs, [site.out, *present], domain=MS,
            name=f"/transformer/h.{layer}/attn/GroupQueryAttention", **attrs)]
        done += 1
    kept = [m for n in g.node if not set(n.output) & replaced
            for m in nodes.get(id(n), [n])]
    del g.node[:]
    g.node.extend(kept)
    return done


class _Site(NamedTuple):
    """One layer's attention as `optimize --target cpu` left it."""
    anchor: onnx.NodeProto  # the node GroupQueryAttention takes the place of
    query: str  # q as attention reads it (rotated)
    key: str  # k as attention reads it (the cache, its heads repeated out)
    out: str  # attention's output [B, S, heads * head_dim]
    scale: float | None  # q.k's scale; None: 1 / sqrt(head_dim)


def _attention_sites(g: onnx.GraphProto, prod: dict, cfg) -> list[_Site]:
    """MultiHeadAttention nodes, or, where the logits are soft-capped (Gemma 2, which no
    fused op of the contract graph takes: export/optimize.py), the attention left as ops:

        q, k_all ─MatMul(k transposed; scale / cap)─Tanh─Mul(cap)─Where(mask)─Softmax─┐
                                                v_all ─MatMul─Transpose─Reshape─▶ out ┘

    found from each Softmax: the scores' MatMul up its chain, the output down its readers."""
    if cfg.attn_softcap is None:
        return [_Site(n, n.input[0], n.input[1], n.output[0], _mha_scale(n))
                for n in g.node if n.op_type == "MultiHeadAttention" and n.domain == MS]
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    sites = []
    for softmax in (n for n in g.node if n.op_type == "Softmax"):
        scores, name = None, softmax.input[0]
        for _ in range(8):  # Where's scores are its second input, the others' their first
            scores = prod.get(name)
            if scores is None or scores.op_type in ("MatMul", "FusedMatMul"):
                break
            name = scores.input[1 if scores.op_type == "Where" else 0]
        chain, name = [], softmax.output[0]
        for op in ("MatMul", "Transpose", "Reshape"):
            nxt = readers.get(name, [])
            if len(nxt) != 1 or nxt[0].op_type != op:
                break
            chain.append(nxt[0])
            name = nxt[0].output[0]
        if scores is None or scores.op_type not in ("MatMul", "FusedMatMul") or len(chain) != 3:
            raise SharedCacheError(f"{softmax.name}: soft-capped attention is not the "
                                   "MatMul, Tanh, Softmax, MatMul form export writes; only "
                                   "graphs from `tinyt optimize --target cpu`")
        sites.append(_Site(chain[-1], scores.input[0], scores.input[1], name,
                           attention_scale(cfg)))
    return sites


def _mha_scale(node: onnx.NodeProto) -> float | None:
    """MultiHeadAttention's own scale attribute (None: 1 / sqrt(head_dim))."""
    return next((a.f for a in node.attribute if a.name == "scale"), None)


def _attention_attrs(cfg, scale: float | None, layer: int) -> dict:
    """What GroupQueryAttention takes over from the model: the attention's scale
    (attention_multiplier, yarn's factor squared), its soft cap (applied to the scaled
    logits, as Gemma 2) and the layer's window."""
    attrs = {}
    if scale is not None:
        attrs["scale"] = scale
    if cfg.attn_softcap is not None:
        attrs["softcap"] = float(cfg.attn_softcap)
    if cfg.windowed(layer):  # ORT counts the query itself in it: W keys, as transformers
        attrs["local_window_size"] = cfg.sliding_window
    return attrs


def _normed_qkv(g: onnx.GraphProto, split: onnx.NodeProto, layer: int, *, whole: bool
                ) -> tuple[list[str], list[onnx.NodeProto]]:
    """q and k after their RMSNorms, for GroupQueryAttention (which rotates them itself); v
    is the Split's third output. The config says which norm the model has:

        per head (Qwen3, Gemma 3)    Split ─Reshape [B, S, heads, hd]─Norm─▶ Reshape [B, S, -1]
        whole projection (OLMo-2)    Split ─Norm [B, S, heads * hd]──────▶ as it is

    Each norm is found from the Split down, not by its weight's name: norms with equal
    weights (a fresh model's ones) share one initializer after optimization."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    out, nodes = [], []
    for which, source in (("q_norm", split.output[0]), ("k_norm", split.output[1])):
        norm, name = None, source
        for _ in range(1 if whole else 4):  # Split (-> Reshape) -> SimplifiedLayerNorm
            nxt = readers.get(name, [])
            norm = next((n for n in nxt if n.op_type == "SimplifiedLayerNormalization"), None)
            if norm is not None or len(nxt) != 1:
                break
            name = nxt[0].output[0]
        if norm is None:
            raise SharedCacheError(f"layer {layer}: no SimplifiedLayerNormalization of its "
                                   f"{which} ({'whole projection' if whole else 'per head'}, "
                                   "as its config says) found after its projection; only "
                                   "graphs from `tinyt optimize --target cpu`")
        if whole:
            out.append(norm.output[0])
            continue
        flat = f"/transformer/h.{layer}/attn/{which}/flat"
        nodes.append(helper.make_node("Reshape", [norm.output[0], "/gqa/bs_flat"], [flat],
                                      name=f"{flat}/Reshape"))
        out.append(flat)
    if nodes and not any(i.name == "/gqa/bs_flat" for i in g.initializer):
        g.initializer.append(onnx.numpy_helper.from_array(np.array([0, 0, -1], np.int64),
                                                          "/gqa/bs_flat"))
    return [*out, split.output[2]], nodes


def _unfuse_skip_layernorm(g: onnx.GraphProto) -> None:
    """SkipLayerNormalization(x, skip, gamma, beta, bias) -> Add (x + bias), Add (+ skip),
    LayerNormalization.
    ONNX Runtime's CPU kernel for the fused op is slow over many rows: on 127 x 128 it took
    88 us where Add + LayerNormalization took 19 (equal at one row), nine times per prefill
    of the demo model. The runtime keeps ONNX Runtime from fusing them back at load. With the
    bias added to x first, ONNX Runtime folds it into the matmul that makes x (MatMulNBits'
    bias input): 8 fewer nodes per demo step, 3-4% of its time."""
    nodes = []
    for n in g.node:
        if not (n.op_type == "SkipLayerNormalization" and n.domain == MS):
            nodes.append(n)
            continue
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-12)
        x, skip, gamma = n.input[:3]
        beta = n.input[3] if len(n.input) > 3 else ""
        bias = n.input[4] if len(n.input) > 4 else ""
        out = list(n.output) + [""] * (4 - len(n.output))
        total = out[3] or f"{n.name}/sum"
        if bias:  # x + bias first: ONNX Runtime then folds the bias into x's matmul
            nodes.append(helper.make_node("Add", [x, bias], [f"{n.name}/x_plus_bias"],
                                          name=f"{n.name}/Add_bias"))
            x = f"{n.name}/x_plus_bias"
        nodes.append(helper.make_node("Add", [x, skip], [total], name=f"{n.name}/Add"))
        nodes.append(helper.make_node("LayerNormalization", [total, gamma] + ([beta] if beta
                                                                            else []),
                                      [out[0]], axis=-1, epsilon=eps,
                                      name=f"{n.name}/LayerNormalization"))
    del g.node[:]
    g.node.extend(nodes)


def _head_input(g: onnx.GraphProto) -> str:
    """The hidden states the lm_head reads: the input of the matmul that makes the logits,
    found from the node that outputs them back through what follows the head elementwise
    (Gemma 2's soft cap: Div, Tanh, Mul by constants). An untied head quantized with a scale
    per row (`quantize --kernel qgemm-rows`, export/blockquant.py) is no single matmul; its
    input is what the rows' quantization divides:

        x ─Abs─ReduceMax─Max─Mul─ row scale ───────────────────────────────┐
        x ─Div(row scale)─Round─Add─Cast─MatMulInteger─Cast─ products ─Mul_rows─Mul_channels─▶
    """
    prod = producers(g)
    consts = _constants(g)
    node = prod["logits"]
    while "MatMul" not in node.op_type and node.op_type != "Gemm":
        ahead = [i for i in node.input if i and i not in consts]
        x = _row_quantized_input(node, ahead, prod)
        if x is not None:
            return x
        if node.op_type not in ELEMENTWISE or len(ahead) != 1 or ahead[0] not in prod:
            raise SharedCacheError(f"the logits come from {node.op_type} {node.name!r}, not "
                                   "from a matmul followed by elementwise ops")
        node = prod[ahead[0]]
    return node.input[0]


ELEMENTWISE = ("Mul", "Div", "Tanh", "Add", "Sub", "Cast")


def _constants(g: onnx.GraphProto) -> set[str]:
    return {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant"
                                              for o in n.output}


def _row_quantized_input(node: onnx.NodeProto, ahead: list[str], prod: dict) -> str | None:
    """x of a row-quantized matmul whose products' row scaling `node` is (the sketch in
    _head_input), or None."""
    if node.op_type != "Mul" or len(ahead) != 2:
        return None
    for products in ahead:
        cast = prod.get(products)
        gemm = prod.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
        if gemm is None or gemm.op_type != "MatMulInteger":
            continue
        div = _upstream(gemm.input[0], prod, lambda n: n.op_type == "Div")
        if div is not None and div.input[1] in ahead:  # divided by the scale it multiplies
            return div.input[0]
    return None


def _head_nodes(g: onnx.GraphProto, x: str) -> list[onnx.NodeProto]:
    """The nodes between the hidden states x and the logits, in graph order; they must read
    nothing else but constants (the last-position rewrite feeds them one row per sequence)."""
    prod, consts = producers(g), _constants(g)
    keep, stack = set(), ["logits"]
    while stack:
        name = stack.pop()
        node = prod.get(name)
        if name == x or name in consts or id(node) in keep:
            continue
        if node is None or node.op_type in ("MultiHeadAttention", "GroupQueryAttention"):
            raise SharedCacheError(f"the lm_head reads {name!r} besides the hidden states "
                                   f"{x!r}; only graphs from `tinyt optimize --target cpu`")
        keep.add(id(node))
        stack.extend(i for i in node.input if i)
    return [n for n in g.node if id(n) in keep]


def _last_position_logits(g: onnx.GraphProto, width: int) -> None:
    """The lm_head reads each row's last query position only (logits [B, 1, V]); the hidden
    states it reads from ([B, S, C], the last norm's output) become the output `hidden_states`,
    so that a caller can score every position of a prompt through the head alone
    (runtime/score.py) without every prompt paying for [B, S, V] logits. Every node of the
    head that reads the hidden states reads the picked rows instead (a row-quantized head's
    two: its scale and its division), so each row's logits are those of the full graph's."""
    old = _head_input(g)
    head = _head_nodes(g, old)
    for n in g.node:  # the value is renamed where it is made and read
        n.input[:] = [HIDDEN_OUTPUT if i == old else i for i in n.input]
        n.output[:] = [HIDDEN_OUTPUT if o == old else o for o in n.output]
    hidden = HIDDEN_OUTPUT
    logits = next(o for o in g.output if o.name == "logits")
    g.output.append(helper.make_tensor_value_info(
        HIDDEN_OUTPUT, logits.type.tensor_type.elem_type, ["batch_size", "sequence_length",
                                                           width]))
    new = [
        helper.make_node("Cast", ["query_seqlens"], ["/lm_head/last/qlens64"],
                         to=TensorProto.INT64, name="/lm_head/last/Cast"),
        helper.make_node("Sub", ["/lm_head/last/qlens64", "/lm_head/last/one"],
                         ["/lm_head/last/index"], name="/lm_head/last/Sub"),
        helper.make_node("Unsqueeze", ["/lm_head/last/index", "/lm_head/last/axis1"],
                         ["/lm_head/last/index2"], name="/lm_head/last/Unsqueeze_index"),
        helper.make_node("GatherND", [hidden, "/lm_head/last/index2"], ["/lm_head/last/rows"],
                         batch_dims=1, name="/lm_head/last/GatherND"),  # [B, C]
        helper.make_node("Unsqueeze", ["/lm_head/last/rows", "/lm_head/last/axis1"],
                         [HEAD_INPUT], name="/lm_head/last/Unsqueeze"),  # [B, 1, C]
    ]
    g.initializer.extend([onnx.numpy_helper.from_array(np.array(1, np.int64), "/lm_head/last/one"),
                          onnx.numpy_helper.from_array(np.array([1], np.int64),
                                                       "/lm_head/last/axis1")])
    readers = [n for n in head if hidden in n.input]
    for n in readers:
        n.input[:] = [HEAD_INPUT if i == hidden else i for i in n.input]
    at = list(g.node).index(readers[0])  # x is made by then; a weight's Transpose may not be
    for i, n in enumerate(new):
        g.node.insert(at + i, n)


def _drop_unused(g: onnx.GraphProto) -> None:
    """Remove what nothing reads any more (the mask subgraph, the Splits, attention_mask).
    The exporter may take the batch size from attention_mask's shape (Shape, start 0, end 1:
    a one-layer Phi-3.5 export's attention output Reshape does); input_ids has the same first
    axis, and the shared-cache graph has no attention_mask."""
    for n in g.node:
        span = {a.name: a.i for a in n.attribute}
        if n.op_type == "Shape" and list(n.input) == ["attention_mask"] \
                and span.get("start", 0) == 0 and span.get("end") == 1:
            n.input[0] = "input_ids"
    drop_dead(g)
    used = {i for n in g.node for i in n.input if i}
    if "attention_mask" in used:
        raise SharedCacheError("the graph reads attention_mask beyond its attention (" + ", ".join(
            n.name for n in g.node if "attention_mask" in n.input) + "), which the shared-cache "
            "graph has no input for; only graphs from `tinyt optimize --target cpu`")
    # position_ids stays an input when GroupQueryAttention places the rotary positions itself
    inputs = [i for i in g.input if i.name in used or i.name == "position_ids"]
    del g.input[:]
    g.input.extend(inputs)
    del g.value_info[:]  # shapes of rewritten values; ONNX Runtime infers the rest


def _retype_io(g: onnx.GraphProto, cfg) -> None:
    ids_at = next(k for k, i in enumerate(g.input) if i.name == "position_ids") + 1
    compact = compact_window_layers(cfg)
    # the windowed layers' counts: seqlens_k's and total_sequence_length's types, own names
    window = [(name, *spec[1:]) for name, spec in zip(WINDOW_INPUTS, GQA_INPUTS)]
    for k, (name, dtype, shape) in enumerate([*GQA_INPUTS, *(window if compact else [])]):
        g.input.insert(ids_at + k, helper.make_tensor_value_info(name, dtype, shape))
    for value in list(g.input) + list(g.output):
        dims = value.type.tensor_type.shape.dim
        if value.name.startswith(("past_key_values.", "present.")):
            dims[2].ClearField("dim_value")
            dims[2].dim_param = WINDOW_CAPACITY if int(value.name.split(".")[1]) in compact \
                else CAPACITY
        elif value.name == "logits":
            dims[1].ClearField("dim_param")
            dims[1].dim_value = 1
