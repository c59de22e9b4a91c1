"""Move the KV cache into the fused attention op.

After onnxscript's fusion each layer still builds its cache with standard ops around a
MultiHeadAttention that sees no cache at all:

    qkv ─Add(bias)─Split─┬─ q ─────────────────────────────────────────────────┐
                         ├─ k ─Reshape─Transpose─┐                             │
                         │        past_k ───Concat(axis 2)─▶ present.i.key     │
                         │                       └─Transpose─Reshape─ k_all ─▶ MHA ─▶ out
                         └─ v ─(the same five ops)───────────────── v_all ───┘

ten layout ops and a bias Add per layer, most of the per-step time of a one-token decode
(lab/profile_ops.py). MultiHeadAttention takes the cache itself (past_key/past_value,
BNSH, our contract's layout), appends the new keys and values and returns present_key /
present_value, and adds the packed QKV bias:

    qkv ─Split─ q, k, v ─▶ MHA(q, k, v, bias, attention_bias, past_k, past_v)
                               ─▶ out, present.i.key, present.i.value

`attention_with_past` rewrites every layer that has the first shape into the second and drops
the ops nothing reads any more. The optimize stage checks the result against its input graph.
"""
from __future__ import annotations

from collections import Counter

import onnx
from onnx import helper

from tinyt.graphio import CONTRIB_DOMAIN

PERM_BSNH_BNSH = [0, 2, 1, 3]  # (B, S, N, H) <-> (B, N, S, H), its own inverse


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output if o}


def _consumers(graph: onnx.GraphProto) -> Counter:
    used = Counter(i for n in graph.node for i in n.input if i)
    used.update(o.name for o in graph.output)
    return used


def _perm(node: onnx.NodeProto) -> list[int] | None:
    for a in node.attribute:
        if a.name == "perm":
            return list(a.ints)
    return None


def _axis(node: onnx.NodeProto, default: int = 0) -> int:
    for a in node.attribute:
        if a.name == "axis":
            return a.i
    return default


def _cache_chain(name: str, prod: dict) -> tuple[str, onnx.NodeProto, str] | None:
    """For MHA's key (or value) input `name`, match
    Reshape(Transpose(Concat(past, Transpose(Reshape(x))))) and return (x, concat, past)."""
    r2 = prod.get(name)
    if r2 is None or r2.op_type != "Reshape":
        return None
    t2 = prod.get(r2.input[0])
    if t2 is None or t2.op_type != "Transpose" or _perm(t2) != PERM_BSNH_BNSH:
        return None
    cat = prod.get(t2.input[0])
    if cat is None or cat.op_type != "Concat" or len(cat.input) != 2 or _axis(cat) != 2:
        return None
    t1 = prod.get(cat.input[1])
    if t1 is None or t1.op_type != "Transpose" or _perm(t1) != PERM_BSNH_BNSH:
        return None
    r1 = prod.get(t1.input[0])
    if r1 is None or r1.op_type != "Reshape":
        return None
    return r1.input[0], cat, cat.input[0]


def _packed_bias(q: str, k: str, v: str, graph: onnx.GraphProto, prod: dict,
                 used: Counter) -> tuple[onnx.NodeProto, str, str] | None:
    """If q, k, v are the three outputs of Split(Add(x, b)) over the last axis, with b a
    constant vector (3 * hidden values) and the sum read by the Split alone, return
    (split, x, b)."""
    split = prod.get(q)
    if split is None or split.op_type != "Split" or list(split.output) != [q, k, v]:
        return None
    add = prod.get(split.input[0])
    if add is None or add.op_type != "Add" or used[add.output[0]] != 1:
        return None
    if _axis(split) not in (-1, 2):  # q feeds MHA's query, so it is (B, S, D): axis 2 is last
        return None
    vectors = {i.name for i in graph.initializer if len(i.dims) == 1}
    for x, b in (add.input, reversed(add.input)):
        if b in vectors:
            return split, x, b
    return None


def attention_with_past(proto: onnx.ModelProto) -> int:
    """Rewrite, in place, every MultiHeadAttention fed by a standard-op KV cache into one
    that takes past_key/past_value and emits present_key/present_value itself. Returns the
    number of layers rewritten."""
    graph = proto.graph
    prod, used = producers(graph), _consumers(graph)
    rewritten = 0
    for node in graph.node:
        if node.op_type != "MultiHeadAttention" or node.domain != CONTRIB_DOMAIN:
            continue
        ins = list(node.input) + [""] * (8 - len(node.input))
        if any(ins[i] for i in (3, 4, 6, 7)) or len(node.output) != 1:
            continue  # already has a bias, padding mask or cache: leave it
        key, value = _cache_chain(ins[1], prod), _cache_chain(ins[2], prod)
        if key is None or value is None:
            continue
        (k, cat_k, past_k), (v, cat_v, past_v) = key, value
        q, bias = ins[0], ""
        packed = _packed_bias(q, k, v, graph, prod, used)
        if packed is not None:
            split, x, bias = packed
            split.input[0] = x
        new = helper.make_node(
            "MultiHeadAttention", [q, k, v, bias, "", ins[5], past_k, past_v],
            [node.output[0], cat_k.output[0], cat_v.output[0]], name=node.name,
            domain=CONTRIB_DOMAIN)
        new.attribute.extend(node.attribute)
        node.CopyFrom(new)
        for cat in (cat_k, cat_v):
            cat.output[0] = ""  # dead now; removed below
        rewritten += 1
    if rewritten:
        drop_dead(graph)
    return rewritten


def drop_dead(graph: onnx.GraphProto) -> None:
    """Remove nodes whose outputs nothing reads, repeatedly, then unused initializers."""
    while True:
        used = _consumers(graph)
        live = [n for n in graph.node if any(o and used[o] for o in n.output)]
        if len(live) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(live)
    used = _consumers(graph)
    keep = [i for i in graph.initializer if used[i.name]]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    names = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    keep_vi = [vi for vi in graph.value_info if vi.name in names]
    del graph.value_info[:]
    graph.value_info.extend(keep_vi)



def cross_attention_bnsh(proto: onnx.ModelProto) -> int:
    """Rewrite, in place, every cross-attention MultiHeadAttention that reads a cached
    encoder key / value graph input (BNSH) through a copy back to (B, S, C), to read the
    input itself: the op takes a BNSH key and value (no bias on them), so a decode step no
    longer copies every layer's cross keys and values twice (the Transpose here, MHA's own
    back to BNSH):

        past_key_values.i.encoder.key (B, N, S, H) ─Transpose─Reshape(0, 0, -1)─▶ MHA key
        becomes  past_key_values.i.encoder.key ─▶ MHA key      (value the same)

    Returns the number of attentions rewritten."""
    graph = proto.graph
    prod, inputs = producers(graph), {i.name for i in graph.input}
    consts = {i.name: i for i in graph.initializer}
    rewritten = 0
    for node in graph.node:
        if node.op_type != "MultiHeadAttention" or node.domain != CONTRIB_DOMAIN:
            continue
        ins = list(node.input) + [""] * (8 - len(node.input))
        if ins[3] or any(ins[6:8]):
            continue  # a bias on the keys / values, or a self-attention cache
        sources = [_bnsh_input(name, prod, inputs, consts) for name in ins[1:3]]
        if None in sources:
            continue
        node.input[1], node.input[2] = sources
        rewritten += 1
    if rewritten:
        drop_dead(graph)
    return rewritten


def _bnsh_input(name: str, prod: dict, inputs: set, consts: dict) -> str | None:
    """The graph input X when `name` is Reshape(Transpose(X, BNSH <-> BSNH), (0, 0, -1))."""
    reshape = prod.get(name)
    if reshape is None or reshape.op_type != "Reshape" or reshape.input[1] not in consts:
        return None
    if list(onnx.numpy_helper.to_array(consts[reshape.input[1]])) != [0, 0, -1]:
        return None
    transpose = prod.get(reshape.input[0])
    if transpose is None or transpose.op_type != "Transpose" \
            or _perm(transpose) != PERM_BSNH_BNSH or transpose.input[0] not in inputs:
        return None
    return transpose.input[0]
