"""A quantized token table's `GatherBlockQuantized` (com.microsoft) as standard ONNX ops, for
ONNX Runtime builds without that kernel (transformers.js' ONNX Runtime Web): the same stored
bytes, the rows a step reads dequantized as the kernel does (torch-free).

    GatherBlockQuantized(data [V, D·bits/8] uint8, ids [*], scales [V, nb] (, zero_points))
      ──▶ Gather(data, ids)                          [*, D·bits/8] uint8
          4 bits: BitwiseAnd 0x0F / BitShift 4 ──▶   [*, D] (low nibble first)
          Cast float, Reshape [*, nb, block]
          Sub (zero point: Gather(zero_points, ids), unpacked alike, or 2^(bits-1))
          Mul Gather(scales, ids) [*, nb, 1], Reshape [*, D]

Only the layout tinyt's quantize stage writes is rewritten (gather_axis 0, quantize_axis 1,
uint8 data, D a multiple of block_size); any other is left as it is and named.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tinyt.graphio import CONTRIB_DOMAIN

OP = "GatherBlockQuantized"


def _static_shape(g: onnx.GraphProto, name: str) -> list[int] | None:
    """The shape of a uint8 initializer, or of a Reshape of one to an initializer shape."""
    inits = {t.name: t for t in g.initializer}
    if name in inits:
        t = inits[name]
        return list(t.dims) if t.data_type == onnx.TensorProto.UINT8 else None
    for node in g.node:
        if name in node.output and node.op_type == "Reshape" and node.input[1] in inits:
            if _static_shape(g, node.input[0]) is None:
                return None
            shape = numpy_helper.to_array(inits[node.input[1]]).tolist()
            return shape if all(d > 0 for d in shape) else None
    return None


def plain_gathers(proto: onnx.ModelProto) -> list[str]:
    """Rewrite each GatherBlockQuantized of the graph (module docstring) in place; returns the
    names of those left (another layout)."""
    g, left, nodes = proto.graph, [], []
    for node in g.node:
        if node.op_type != OP or node.domain != CONTRIB_DOMAIN:
            nodes.append(node)
            continue
        made = _rewrite(g, node)
        if made is None:
            nodes.append(node)
            left.append(node.name)
        else:
            nodes.extend(made)
    del g.node[:]
    g.node.extend(nodes)
    if not any(n.domain == CONTRIB_DOMAIN for n in g.node):
        kept = [o for o in proto.opset_import if o.domain != CONTRIB_DOMAIN]
        del proto.opset_import[:]
        proto.opset_import.extend(kept)
    return left


def _rewrite(g: onnx.GraphProto, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The standard ops for one GatherBlockQuantized, or None for a layout not handled."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    bits, block = attrs.get("bits", 4), attrs.get("block_size", 128)
    shape = _static_shape(g, node.input[0])
    if (attrs.get("gather_axis", 0) != 0 or attrs.get("quantize_axis", 1) != 1
            or bits not in (4, 8) or shape is None or len(shape) != 2):
        return None
    width = shape[1] * 8 // bits  # D: the row's values
    if width % block:
        return None
    nb, p = width // block, f"{node.name}/plain"
    data, ids, scales = node.input[:3]
    zero = node.input[3] if len(node.input) > 3 and node.input[3] else None
    out: list[onnx.NodeProto] = []

    def const(name: str, value) -> str:
        out.append(helper.make_node("Constant", [], [f"{p}/{name}"], name=f"{p}/{name}",
                                    value=numpy_helper.from_array(np.asarray(value))))
        return f"{p}/{name}"

    def op(kind: str, inputs: list[str], name: str, **kw) -> str:
        out.append(helper.make_node(kind, inputs, [f"{p}/{name}"], name=f"{p}/{name}", **kw))
        return f"{p}/{name}"

    lead = op("Shape", [ids], "ids_shape")

    def shaped(x: str, tail: list[int], name: str) -> str:
        return op("Reshape", [x, op("Concat", [lead, const(f"{name}_tail",
                                                            np.array(tail, np.int64))],
                                    f"{name}_shape", axis=0)], name)

    def unpack(x: str, n: int, name: str) -> str:  # [*, n] uint8 -> [*, 2n], low nibble first
        lo = op("BitwiseAnd", [x, const(f"{name}_mask", np.uint8(0x0F))], f"{name}_lo")
        hi = op("BitShift", [x, const(f"{name}_four", np.uint8(4))], f"{name}_hi",
                direction="RIGHT")
        axis = const(f"{name}_axis", np.array([-1], np.int64))
        pair = op("Concat", [op("Unsqueeze", [lo, axis], f"{name}_lo1"),
                             op("Unsqueeze", [hi, axis], f"{name}_hi1")], f"{name}_pair", axis=-1)
        return shaped(pair, [2 * n], f"{name}_unpacked")

    q = op("Gather", [data, ids], "rows", axis=0)
    if bits == 4:
        q = unpack(q, shape[1], "rows")
    x = shaped(op("Cast", [q], "rows_f", to=onnx.TensorProto.FLOAT), [nb, block], "blocks")
    last = const("last", np.array([-1], np.int64))
    if zero is None:
        z = const("zero", np.float32(2 ** (bits - 1)))
    else:
        z = op("Gather", [zero, ids], "zero_rows", axis=0)
        zshape = _static_shape(g, zero)
        if bits == 4:
            if zshape is None:
                return None
            z = unpack(z, zshape[1], "zero")
            z = op("Slice", [z, const("zero_from", np.array([0], np.int64)),
                             const("zero_to", np.array([nb], np.int64)), last], "zero_nb")
        z = op("Unsqueeze", [op("Cast", [z], "zero_f", to=onnx.TensorProto.FLOAT), last],
               "zero_b")
    s = op("Unsqueeze", [op("Gather", [scales, ids], "scale_rows", axis=0), last], "scale_b")
    y = op("Mul", [op("Sub", [x, z], "centred"), s], "values")
    out.append(helper.make_node("Reshape", [y, op("Concat", [lead, const(
        "width", np.array([width], np.int64))], "out_shape", axis=0)], list(node.output),
        name=f"{p}/out"))
    return out
