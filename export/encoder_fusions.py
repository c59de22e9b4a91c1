"""The optimize stage's rewrites of an encoder's graph after its fusions (torch-free).

1. `unfuse_skip_layer_norms`: onnxscript (and ONNX Runtime's own pass) fuse each residual sum
   with its LayerNorm into SkipLayerNormalization, whose CPU kernel is a scalar loop with a
   division per value: at 32 texts x 128 tokens x 384 (all-MiniLM-L6-v2) it took 7.9 ms where
   Sum + LayerNormalization took 1.5 (3-5x from 16 to 4,096 rows; equal at one row, says
   gqa_graph.py), 13 times a pass, ~8% of the whole graph's time. Each becomes

       x ──Add(bias)──Sum(·, skip)──LayerNormalization(gamma, beta)──▶ out   (Sum ─▶ out 3)

   Sum, not Add: ONNX Runtime fuses Add + LayerNormalization back at load (tinyt's runtime
   turns that fusion off, but Optimum's and fastembed's sessions do not); Sum of two inputs is
   the same arithmetic and no fusion matches it. The bias is added first, as the exported
   graph adds it (the Linear's own bias), so the sums round exactly as before fusion.

2. `embed_layer_norm`: BERT's embedding (word + position [+ token type] rows, summed, then
   LayerNorm) into ONNX Runtime's EmbedLayerNormalization, with tinyt's own positions (counted
   from the attention mask, + RoBERTa's offset) given as position_ids, so left padding and
   offsets stay exact:

       input_ids ─────────Cast(int32)─┐
       token_type_ids ────Cast(int32)─┤  (its indices, whatever computes them)
       positions ─────────Cast(int32)─┴─▶ EmbedLayerNormalization(word, position, type
                                              tables, gamma, beta) ─▶ embeddings

   The kernel (contrib_ops/cpu/bert/embed_layer_norm.cc) reads int32 ids, position_ids of
   [B, S] (or [1, S]), an optional segment table; it rejects ids outside a table (so does
   Gather) and negative positions (tinyt's are clamped at 0). It sums word + position (+ type)
   where the export sums word + type + position: the same values, rounded in another order.
"""
from __future__ import annotations

import onnx
from onnx import helper

from tinyt.graphio import CONTRIB_DOMAIN

from .kvfuse import drop_dead, producers

MS = CONTRIB_DOMAIN
INT32 = onnx.TensorProto.INT32


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _readers(graph: onnx.GraphProto) -> dict[str, int]:
    used: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            if i:
                used[i] = used.get(i, 0) + 1
    for o in graph.output:
        used[o.name] = used.get(o.name, 0) + 1
    return used


def unfuse_skip_layer_norms(proto: onnx.ModelProto) -> int:
    """Rewrite, in place, every SkipLayerNormalization whose mean and inverse deviation
    (outputs 1, 2) nothing reads into [Add(bias)] + Sum + LayerNormalization (the module's
    docstring says why). Returns how many were rewritten."""
    graph = proto.graph
    used = _readers(graph)
    nodes, rewritten = [], 0
    for n in graph.node:
        outs = list(n.output) + [""] * (4 - len(n.output))
        if n.op_type != "SkipLayerNormalization" or n.domain != MS or \
                any(o and used.get(o) for o in outs[1:3]):
            nodes.append(n)
            continue
        ins = list(n.input) + [""] * (5 - len(n.input))
        x, skip, gamma, beta, bias = ins[:5]
        if bias:  # the Linear's bias first, as the export adds it
            nodes.append(helper.make_node("Add", [x, bias], [f"{n.name}/x_plus_bias"],
                                          name=f"{n.name}/Add_bias"))
            x = f"{n.name}/x_plus_bias"
        total = outs[3] or f"{n.name}/sum"
        nodes.append(helper.make_node("Sum", [x, skip], [total], name=f"{n.name}/Sum"))
        nodes.append(helper.make_node(
            "LayerNormalization", [total, gamma] + ([beta] if beta else []), [outs[0]],
            axis=-1, epsilon=_attrs(n).get("epsilon", 1e-12),
            name=f"{n.name}/LayerNormalization"))
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten


def _sum_leaves(name: str, prod: dict, used: dict, tree: list) -> list[str] | None:
    """The values an Add / Sum tree ending at `name` adds up, each tree node read only by the
    tree (appended to `tree`); None where a node inside is read elsewhere too."""
    node = prod.get(name)
    if node is None or node.op_type not in ("Add", "Sum") or node.domain:
        return [name]
    if used.get(name, 0) != 1:
        return None
    tree.append(node)
    leaves = []
    for i in node.input:
        sub = _sum_leaves(i, prod, used, tree)
        if sub is None:
            return None
        leaves += sub
    return leaves


def _table_gather(name: str, prod: dict, tables: dict) -> onnx.NodeProto | None:
    node = prod.get(name)
    if node is None or node.op_type != "Gather" or node.domain or \
            _attrs(node).get("axis", 0) != 0 or node.input[0] not in tables:
        return None
    return node


def embed_layer_norm(proto: onnx.ModelProto, cfg, input_ids: str = "input_ids") -> int:
    """Rewrite, in place, the embedding LayerNorm over a sum of table rows (word, position
    and, where the model has them, token-type rows) into EmbedLayerNormalization. The tables
    are told apart by their rows (cfg: vocab_size, block_size + position_offset,
    type_vocab_size) and the word lookup must read the graph's `input_ids`. Returns 1 where
    it was rewritten, 0 where the graph has no such embedding."""
    graph = proto.graph
    prod, used = producers(graph), _readers(graph)
    tables = {i.name: list(i.dims) for i in graph.initializer
              if len(i.dims) == 2 and i.data_type == onnx.TensorProto.FLOAT}
    vectors = {i.name for i in graph.initializer if list(i.dims) == [cfg.n_embd]}
    rows = {"word": cfg.vocab_size, "position": cfg.block_size + cfg.position_offset,
            "segment": cfg.type_vocab_size}
    for ln in graph.node:
        if ln.op_type != "LayerNormalization" or ln.domain or len(ln.input) < 3 or \
                _attrs(ln).get("axis", -1) != -1 or not set(ln.input[1:3]) <= vectors or \
                any(o and used.get(o) for o in ln.output[1:]):
            continue
        tree: list[onnx.NodeProto] = []
        leaves = _sum_leaves(ln.input[0], prod, used, tree)
        if not tree or leaves is None or not 2 <= len(leaves) <= 3:
            continue
        gathers = [g for v in leaves if (g := _table_gather(v, prod, tables)) is not None
                   and used.get(g.output[0]) == 1]  # each lookup read by the sum alone
        if len(gathers) != len(leaves):
            continue
        found: dict[str, onnx.NodeProto] = {}
        for g in gathers:
            n_rows, width = tables[g.input[0]]
            role = "word" if g.input[1] == input_ids else \
                "segment" if len(gathers) == 3 and n_rows == rows["segment"] else "position"
            if width != cfg.n_embd or n_rows != rows[role] or role in found:
                found = {}
                break
            found[role] = g
        if set(found) not in ({"word", "position"}, {"word", "position", "segment"}):
            continue
        _replace(graph, ln, found)
        if not any(o.domain == MS for o in proto.opset_import):
            proto.opset_import.append(helper.make_opsetid(MS, 1))
        return 1
    return 0


def _replace(graph: onnx.GraphProto, ln: onnx.NodeProto, found: dict) -> None:
    """The LayerNorm becomes the fused op (in its place: every input is made before it), the
    lookups and their sum are dropped."""
    base = "/transformer/embeddings"
    nodes = []

    def int32(role: str) -> str:
        if role not in found:
            return ""
        out = f"{base}/{role}_ids_int32"
        nodes.append(helper.make_node("Cast", [found[role].input[1]], [out], to=INT32,
                                      name=f"{base}/{role}_ids/Cast"))
        return out

    ids, segment, positions = int32("word"), int32("segment"), int32("position")
    table = {r: (found[r].input[0] if r in found else "") for r in ("word", "position",
                                                                    "segment")}
    fused = helper.make_node(
        "EmbedLayerNormalization",
        [ids, segment, table["word"], table["position"], table["segment"], ln.input[1],
         ln.input[2], "", positions],
        [ln.output[0], f"{base}/mask_index"],  # unread; its type inference needs it named
        domain=MS,
        epsilon=_attrs(ln).get("epsilon", 1e-12), name=f"{base}/EmbedLayerNormalization")
    at = list(graph.node).index(ln)
    keep = list(graph.node[:at]) + nodes + [fused] + list(graph.node[at + 1:])
    del graph.node[:]
    graph.node.extend(keep)
    drop_dead(graph)  # the lookups and their sum: nothing reads them any more
