"""llama.cpp's activation rounding before each carried GGUF table (torch-free): `tinyt
quantize --gguf-blocks --mode weight-only --activations q8`, so that the graph computes the
numbers llama.cpp computes on the same file.

llama.cpp (ggml-cpu, x86: arch/x86/quants.c quantize_row_q8_0 / q8_1; the repacked Q4_0
path's ggml_quantize_mat_q8_0_4x8 rounds the same way) multiplies a 4- or 8-bit weight
matrix by an activation row it first makes 8-bit, in blocks of 32 along K:

    amax = max |x_j| over the block           id = 127.f / amax (0 where amax is 0)
    q_j  = round-half-even(x_j · id)           (_mm256_round_ps, _MM_ROUND_NEAREST)
    d    = fp16(amax / 127.f)                  (the stored scale: fp32 quotient, then fp16)
    q8_1 also stores s = fp16(amax/127.f · Σ q_j)   (for Q4_1's minimum: m · s)

and sums per block (d_w · d) · Σ q_w q_j (+ m_w · s for Q4_1) in fp32. The weight is Q4_0,
Q4_1 or Q8_0 (the tied table): Q4_0 and Q8_0 take q8_0, Q4_1 q8_1 (ggml's vec_dot_type).

The graph rounds the same way with standard ops, then MatMulNBits at accuracy_level 0
multiplies the rounded values x' = q · d by the carried table in fp32, whose products are
llama.cpp's integer ones up to the order of fp32 sums:

    x [.., K] ─Reshape [-1, 32]─▶ xb ─Abs─ReduceMax─▶ amax [R, 1]
      id = Div(127, Max(amax, 1e-30))                  (amax 0: every x 0, q 0 either way)
      q  = Round(Mul(xb, id))                          (ONNX Round: half to even)
      d  = Cast(Cast(Div(amax, 127), fp16), fp32)
      x' = Reshape(Mul(q, d), Shape(x)) ──MatMulNBits(table)──▶ y
    Q4_1 (q8_1): y += Reshape(fp16(amax/127 · Σq) − d · Σq, [.., K/32]) @ M   (M [K/32, N]:
      each block's minimum m = −z·d_w; what llama.cpp's fp16 s moves beyond x'·w')

One chain per activation tensor however many tables read it (q, k, v and gate, up share one).

The rounding makes an ulp matter: where the fp32 value before it differs from llama.cpp's by
an ulp across a half level, the level differs by one, and the next layers round that into
more. The first such value is each RMSNorm's: ggml sums the squares in double
(ggml_compute_forward_rms_norm_f32: ggml_float sum; mean = sum / n, then float), ONNX
Runtime's ReduceMean in fp32, and on SmolLM2's tokens the two means differ in 89% of rows, the
levels after the first norm in 20%. `double_norms` makes each mean of squares a double one
(Cast, ReduceMean, Cast): on SmolLM2 cut to its first layer the positions within 1e-3 of
llama.cpp go from 41% to 96%.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .gguf_blocks import BLOCK

# the carried table's GGUF type -> the activation blocks llama.cpp multiplies it with
VEC_DOT_TYPE = {"Q4_0": "q8_0", "Q8_0": "q8_0", "Q4_1": "q8_1"}
TINY = 1e-30  # amax below it has d = fp16(amax / 127) = 0: the block's products are 0 either way


def round_activations(graph: onnx.GraphProto, carried: dict[str, str]) -> list[str]:
    """Insert llama.cpp's activation rounding before every MatMulNBits that reads a carried
    table (`carried`: the table's weight name -> its GGUF type, QuantReport.carried); returns
    "node (q8_0|q8_1)" for each. The graph's nodes stay in topological order: a chain is put
    just before the first node that reads it."""
    inits = {i.name: i for i in graph.initializer}
    consts = _constants(graph)
    chains: dict[str, tuple[str, str, str]] = {}  # activation -> (x', d·Σq name, s name)
    nodes, done = [], []
    for node in graph.node:
        kind = _carried_kind(node, carried)
        if kind is None:
            nodes.append(node)
            continue
        x = node.input[0]
        if x not in chains:
            chains[x] = _chain(x, nodes, consts)
        xq, dsum, s = chains[x]
        node.input[0] = xq
        done.append(f"{node.name} ({VEC_DOT_TYPE[kind]})")
        nodes.append(node)
        if VEC_DOT_TYPE[kind] == "q8_1":
            _minimum_term(node, x, inits, graph, dsum, s, nodes)
    del graph.node[:]
    graph.node.extend(nodes)
    return done


def _carried_kind(node: onnx.NodeProto, carried: dict[str, str]) -> str | None:
    """The GGUF type of the carried table a MatMulNBits reads ({weight}_q4 / _q8), else None."""
    if node.op_type != "MatMulNBits":
        return None
    weight = node.input[1].rsplit("_q", 1)[0]
    return carried.get(weight)


def _constants(graph: onnx.GraphProto) -> dict[str, str]:
    """The chain's shared constants, added to the graph once."""
    values = {"rows": np.array([-1, BLOCK], np.int64), "axis": np.array([-1], np.int64),
              "tiny": np.array(TINY, np.float32), "levels": np.array(127, np.float32)}
    names = {k: f"/gguf_q8/{k}" for k in values}
    graph.initializer.extend(numpy_helper.from_array(v, names[k]) for k, v in values.items())
    return names


def _chain(x: str, nodes: list, c: dict[str, str]) -> tuple[str, str, str]:
    """The rounding of activation x (module docstring), appended to nodes: (x', d·Σq, s)
    where the last two are q8_1's per-block terms [R, 1] (dead unless a Q4_1 table reads x;
    drop_dead removes them)."""
    p = f"/gguf_q8/{x}"
    steps = [  # (output, op, inputs, attributes)
        ("xb", "Reshape", [x, c["rows"]], {}),
        ("abs", "Abs", ["@xb"], {}),
        ("amax", "ReduceMax", ["@abs", c["axis"]], {"keepdims": 1}),
        ("safe", "Max", ["@amax", c["tiny"]], {}),
        ("id", "Div", [c["levels"], "@safe"], {}),
        ("scaled", "Mul", ["@xb", "@id"], {}),
        ("q", "Round", ["@scaled"], {}),
        ("d32", "Div", ["@amax", c["levels"]], {}),
        ("d16", "Cast", ["@d32"], {"to": TensorProto.FLOAT16}),
        ("d", "Cast", ["@d16"], {"to": TensorProto.FLOAT}),
        ("xq_rows", "Mul", ["@q", "@d"], {}),
        ("shape", "Shape", [x], {}),
        ("xq", "Reshape", ["@xq_rows", "@shape"], {}),
        # q8_1: Σq, llama.cpp's s = fp16(d32 · Σq) and what x' carries instead, d · Σq
        ("qsum", "ReduceSum", ["@q", c["axis"]], {"keepdims": 1}),
        ("s32", "Mul", ["@d32", "@qsum"], {}),
        ("s16", "Cast", ["@s32"], {"to": TensorProto.FLOAT16}),
        ("s", "Cast", ["@s16"], {"to": TensorProto.FLOAT}),
        ("dsum", "Mul", ["@d", "@qsum"], {})]
    for out, op, inputs, attrs in steps:
        ins = [f"{p}/{i[1:]}" if i.startswith("@") else i for i in inputs]
        nodes.append(helper.make_node(op, ins, [f"{p}/{out}"], name=f"{p}/{out}", **attrs))
    return f"{p}/xq", f"{p}/dsum", f"{p}/s"


def _minimum_term(node: onnx.NodeProto, x: str, inits: dict, graph: onnx.GraphProto,
                  dsum: str, s: str, nodes: list) -> None:
    """Q4_1 x q8_1: add Σ_b m_b · (s_b − d·Σq_b) to the MatMulNBits' output, the part of
    llama.cpp's m · s that x' · w' (whose m · d · Σq is exact in fp32) leaves out."""
    scales = numpy_helper.to_array(inits[node.input[2]])  # [N, nb]
    zeros = numpy_helper.to_array(inits[node.input[3]])  # [N, nb] float: m = -fl(z·d)
    minima = f"{node.input[1]}_minima"
    if minima not in inits:
        m = -(zeros * scales).astype(np.float32)
        inits[minima] = numpy_helper.from_array(np.ascontiguousarray(m.T), minima)  # [nb, N]
        graph.initializer.append(inits[minima])
    p, y = f"{node.name}/q8_1", node.output[0]
    x_shape = f"/gguf_q8/{x}/shape"
    steps = [("delta", "Sub", [s, dsum]),  # [R, 1], R = rows · K/32
             ("blocks", "Concat", [f"{p}/lead", f"{p}/nb"]),
             ("lead", "Slice", [x_shape, f"{p}/zero", f"{p}/minus_one"]),
             ("delta_rows", "Reshape", [f"{p}/delta", f"{p}/blocks"]),  # [.., K/32]
             ("term", "MatMul", [f"{p}/delta_rows", minima])]
    K = next(a.i for a in node.attribute if a.name == "K")
    graph.initializer.extend([
        numpy_helper.from_array(np.array([K // BLOCK], np.int64), f"{p}/nb"),
        numpy_helper.from_array(np.array([0], np.int64), f"{p}/zero"),
        numpy_helper.from_array(np.array([-1], np.int64), f"{p}/minus_one")])
    node.output[0] = f"{p}/product"
    order = ["delta", "lead", "blocks", "delta_rows", "term"]
    made = {out: helper.make_node(op, ins, [f"{p}/{out}"], name=f"{p}/{out}",
                                  **({"axis": 0} if op == "Concat" else {}))
            for out, op, ins in steps}
    nodes.extend(made[o] for o in order)
    nodes.append(helper.make_node("Add", [f"{p}/product", f"{p}/term"], [y], name=f"{p}/Add"))


def double_norms(graph: onnx.GraphProto) -> int:
    """Each RMSNorm's mean of squares (a ReduceMean of Pow(x, 2)) taken in double and rounded
    to float once, as ggml takes it; returns how many."""
    inits = {i.name: i for i in graph.initializer}
    squares = {n.output[0] for n in graph.node if n.op_type == "Pow" and n.input[1] in inits
               and float(numpy_helper.to_array(inits[n.input[1]])) == 2.0}
    nodes, done = [], 0
    for node in graph.node:
        if node.op_type != "ReduceMean" or node.input[0] not in squares:
            nodes.append(node)
            continue
        p, out = node.name or node.output[0], node.output[0]
        nodes.append(helper.make_node("Cast", [node.input[0]], [f"{p}/f64"], name=f"{p}/Cast64",
                                      to=TensorProto.DOUBLE))
        node.input[0], node.output[0] = f"{p}/f64", f"{p}/mean64"
        nodes.append(node)
        nodes.append(helper.make_node("Cast", [f"{p}/mean64"], [out], name=f"{p}/Cast32",
                                      to=TensorProto.FLOAT))
        done += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return done
