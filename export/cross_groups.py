"""Beams of one source read its cross-attention keys / values once: a decoder step's
cross-attention takes the cached encoder keys / values of each source (batch S) while its
queries are rows of R = S x k (k beams or rows a source, consecutive), so the caller need not
copy each source's cache k times, nor the op read it k times (at Whisper's 1,500 frames, 5
beams made MultiHeadAttention 8.9 of a 13.4 ms step, AMD EPYC, 1 thread).

    query [R, L, C] ──Reshape(S, -1, C)──▶ [S, k·L, C] ─▶ MHA(·, key [S, N, T, H], value)
        ──▶ [S, k·L, C] ──Reshape(Shape(query))──▶ [R, L, C]

Cross-attention has no mask over the queries and no position among them, so k·L queries of
one source against its keys are the k rows' L queries each. With k = 1 (a cache fed per row,
as Optimum feeds it) the graph computes what it did. The graph says it takes grouped caches in
its metadata (tinyt.contract.CROSS_GROUPS: the attentions rewritten); the runtime
(runtime/encoder_decoder.DecoderSteps) feeds them so only where it finds that key.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tinyt.contract import CROSS_GROUPS
from tinyt.graphio import CONTRIB_DOMAIN


def group_cross_attention(proto: onnx.ModelProto) -> int:
    """Rewrite, in place, every MultiHeadAttention that reads cached keys and values straight
    from graph inputs (query, key, value and nothing else: export/kvfuse.cross_attention_bnsh's
    form) to take the keys' batch as its own and the query's rows k to a source; mark the graph
    (CROSS_GROUPS). Returns the number of attentions rewritten."""
    graph = proto.graph
    inputs = {i.name for i in graph.input}
    minus_one = "cross_groups/minus_one"
    nodes: list[onnx.NodeProto] = []
    rewritten = 0
    for node in graph.node:
        ins = list(node.input)
        if node.op_type != "MultiHeadAttention" or node.domain != CONTRIB_DOMAIN \
                or len(ins) < 3 or any(ins[3:]) or not {ins[1], ins[2]} <= inputs:
            nodes.append(node)
            continue
        p = f"/cross_groups.{rewritten}"
        q, out = ins[0], node.output[0]
        nodes += [
            helper.make_node("Shape", [q], [f"{p}/q_shape"], name=f"{p}/QueryShape"),
            helper.make_node("Shape", [ins[1]], [f"{p}/sources"], name=f"{p}/Sources",
                             start=0, end=1),
            helper.make_node("Shape", [q], [f"{p}/width"], name=f"{p}/Width", start=2),
            helper.make_node("Concat", [f"{p}/sources", minus_one, f"{p}/width"],
                             [f"{p}/grouped_shape"], name=f"{p}/GroupedShape", axis=0),
            helper.make_node("Reshape", [q, f"{p}/grouped_shape"], [f"{p}/grouped"],
                             name=f"{p}/Group")]
        node.input[0], node.output[0] = f"{p}/grouped", f"{p}/out"
        nodes += [node, helper.make_node("Reshape", [f"{p}/out", f"{p}/q_shape"], [out],
                                         name=f"{p}/Ungroup")]
        rewritten += 1
    if rewritten:
        graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), minus_one))
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props},
                                            CROSS_GROUPS: str(rewritten)})
    return rewritten
