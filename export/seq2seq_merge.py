"""Optimum's merged decoder, made from an encoder-decoder's two decoder graphs (torch-free): the
one decoder graph transformers.js runs (and Optimum's ORTModelForSeq2SeqLM can), each weight
stored once.

    decoder_model.onnx (D) ─┐
    decoder_with_past (P) ──┴─▶ decoder_model_merged.onnx
      inputs   encoder_attention_mask, input_ids, encoder_hidden_states (D's),
               past_key_values.{i}.decoder/.encoder.key/.value (P's), use_cache_branch bool [1]
      initializers  every weight of D and P, once (equal tensors shared; the outer graph's,
                    so both branches read them); shape constants stay in their branch
      If(use_cache_branch)
        ├─ else (first step): D's nodes           -> logits, present.{i}.decoder.*, .encoder.*
        └─ then (cached step): P's nodes          -> logits, present.{i}.decoder.*,
                               + an empty constant for each present.{i}.encoder.* (the
                                 cross-attention cache does not change; the caller keeps
                                 the first step's, as transformers.js and Optimum do)
      outputs  D's (seq2seq_merged_contract)

On the first step the caller feeds the past caches empty ([B, heads, 0, head_dim]); on a cached
step the hidden states are fed but unread. check_merged runs the merged graph under ONNX
Runtime beside the two graphs on seq2seq_checks' random inputs.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tinyt.config import ModelConfig
from tinyt.contract import USE_CACHE_BRANCH, seq2seq_contract, seq2seq_merged_contract
from tinyt.errors import PackageError

from .compare import reorder_bound
from .seq2seq_checks import CASE_KEYS, check_cases, graph_feeds, note_worst, role_cases

ROLES = ("decoder", "decoder_with_past")
BRANCH = {"decoder": "first_step", "decoder_with_past": "cached_step"}
# Initializers that stay in their branch, as Optimum keeps them: scalars and 1-D int tensors
# (shape constants, a few bytes each), which ONNX Runtime's optimizers fold only when they are
# the branch's own.
SHAPE_TYPES = (onnx.TensorProto.INT32, onnx.TensorProto.INT64)


def _stays(t: onnx.TensorProto) -> bool:
    return len(t.dims) == 0 or (len(t.dims) == 1 and t.data_type in SHAPE_TYPES)


def _names(g: onnx.GraphProto) -> set[str]:
    """Every value name a graph uses."""
    names = {v.name for v in [*g.input, *g.output, *g.value_info]}
    names |= {t.name for t in g.initializer}
    for node in g.node:
        names.update(node.input)
        names.update(node.output)
    return names


def _check_graphs(protos: dict[str, onnx.ModelProto], cfg: ModelConfig) -> None:
    """Each graph holds its contract's inputs and outputs in order and no subgraph; their
    opsets agree. PackageError naming the difference otherwise."""
    contract = seq2seq_contract(cfg)
    for role, proto in protos.items():
        g = proto.graph
        for what, got, spec in (("inputs", [v.name for v in g.input], contract[role][0]),
                                ("outputs", [v.name for v in g.output], contract[role][1])):
            if got != [s.name for s in spec]:
                raise PackageError(f"the {role} graph's {what} {got} are not its contract's "
                                   f"{[s.name for s in spec]}: merge graphs tinyt exported")
        nested = [n.name or n.op_type for n in g.node
                  if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                         for a in n.attribute)]
        if nested:
            raise PackageError(f"the {role} graph holds control flow ({', '.join(nested[:3])}): "
                               "the merged decoder is made of graphs without subgraphs")
        if USE_CACHE_BRANCH in _names(g):
            raise PackageError(f"the {role} graph uses the name {USE_CACHE_BRANCH!r} already")
    opsets = [{o.domain: o.version for o in p.opset_import} for p in protos.values()]
    for domain in opsets[0].keys() & opsets[1].keys():
        if opsets[0][domain] != opsets[1][domain]:
            raise PackageError(f"the decoder graphs import opset {domain or 'ai.onnx'} at "
                               f"{opsets[0][domain]} and {opsets[1][domain]}: export them together")


def _content(t: onnx.TensorProto) -> tuple:
    """What makes two initializers the same tensor: type, shape, bytes."""
    return (t.data_type, tuple(t.dims),
            hashlib.sha256(numpy_helper.to_array(t).tobytes()).hexdigest())


def _outer_name(name: str, key: tuple, role: str, own: set[str], other: set[str],
                other_weights: dict[str, tuple], taken: set[str]) -> str:
    """A weight's name in the outer graph: its own, unless another tensor or value holds it
    there or in the other graph (the other graph's equal weight may), else suffixed by role."""
    def free(n: str) -> bool:
        return n not in taken and (n not in other or other_weights.get(n) == key)
    out, k = name, 1
    while not free(out) or (out != name and out in own):
        out, k = f"{name}.{BRANCH[role]}{k if k > 1 else ''}", k + 1
    return out


def _hoist(protos: dict[str, onnx.ModelProto]) -> list[onnx.TensorProto]:
    """Move each graph's weights to one outer list, equal tensors (type, shape, bytes) once,
    renaming their uses where a name means something else in the other graph; returns the
    list. The graphs keep their shape constants."""
    used = {role: _names(p.graph) for role, p in protos.items()}
    weights = {role: {t.name: _content(t) for t in p.graph.initializer if not _stays(t)}
               for role, p in protos.items()}
    outer: list[onnx.TensorProto] = []
    by_content: dict[tuple, str] = {}
    taken: set[str] = set()
    for role, proto in protos.items():
        g, (other,) = proto.graph, [r for r in protos if r != role]
        rename, keep = {}, []
        for t in g.initializer:
            if _stays(t):
                keep.append(t)
                continue
            key = weights[role][t.name]
            name = by_content.get(key)
            if name is None:
                name = _outer_name(t.name, key, role, used[role], used[other], weights[other],
                                   taken)
                by_content[key], copy = name, onnx.TensorProto()
                taken.add(name)
                copy.CopyFrom(t)
                copy.name = name
                outer.append(copy)
            if name != t.name:
                rename[t.name] = name
        del g.initializer[:]
        g.initializer.extend(keep)
        for node in g.node:
            for i, x in enumerate(node.input):
                node.input[i] = rename.get(x, x)
    return outer


def _value_info(spec) -> onnx.ValueInfoProto:
    dtype = helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
    return helper.make_tensor_value_info(spec.name, dtype, list(spec.shape))


def merge_decoders(decoder: onnx.ModelProto, with_past: onnx.ModelProto,
                   cfg: ModelConfig) -> onnx.ModelProto:
    """decoder_model_merged.onnx from the two decoder graphs (module docstring). The protos
    given are taken apart (their weights move out): pass copies to keep them."""
    protos = dict(zip(ROLES, (decoder, with_past)))
    _check_graphs(protos, cfg)
    outer = _hoist(protos)
    inputs, outputs = seq2seq_merged_contract(cfg)
    d, p = protos["decoder"].graph, protos["decoder_with_past"].graph
    # the cached step's cross-attention presents: empty, of the output's rank and fixed axes
    produced, empties = {v.name for v in p.output}, []
    for spec in outputs:
        if spec.name not in produced:
            shape = [0 if isinstance(a, str) else a for a in spec.shape]
            empties.append(helper.make_node(
                "Constant", [], [spec.name], name=f"/merged/empty/{spec.name}",
                value=numpy_helper.from_array(np.zeros(shape, np.float32), spec.name)))
    branch_outputs = [_value_info(s) for s in outputs]  # the exporter's metadata left out
    first = helper.make_graph(d.node, BRANCH["decoder"], [], branch_outputs,
                              initializer=d.initializer, value_info=d.value_info)
    cached = helper.make_graph([*p.node, *empties], BRANCH["decoder_with_past"], [],
                               branch_outputs, initializer=p.initializer,
                               value_info=p.value_info)
    node = helper.make_node("If", [USE_CACHE_BRANCH], [s.name for s in outputs],
                            name="/merged/If", then_branch=cached, else_branch=first)
    graph = helper.make_graph([node], "merged", [_value_info(s) for s in inputs],
                              [_value_info(s) for s in outputs], initializer=outer)
    opsets = {o.domain: o for p_ in protos.values() for o in p_.opset_import}
    model = helper.make_model(graph, opset_imports=list(opsets.values()),
                              producer_name="tinyt",
                              ir_version=max(p_.ir_version for p_ in protos.values()))
    onnx.checker.check_model(model)
    return model


def merged_feeds(cfg: ModelConfig, role: str, feeds: dict[str, np.ndarray]
                 ) -> dict[str, np.ndarray]:
    """The merged graph's inputs for one step of `role`'s graph given that graph's `feeds`,
    as transformers.js feeds them: on the first step the past caches empty, on a cached step
    the hidden states (unread; empty here)."""
    inputs, _ = seq2seq_merged_contract(cfg)
    b = len(feeds["input_ids"])
    out = {USE_CACHE_BRANCH: np.array([role == "decoder_with_past"])}
    for spec in inputs:
        if spec.name in feeds:
            out[spec.name] = feeds[spec.name]
        if spec.name in out:
            continue
        sizes = {"batch_size": b}  # every other symbolic axis empty
        shape = [a if isinstance(a, int) else sizes.get(a, 0) for a in spec.shape]
        out[spec.name] = np.zeros(shape, np.dtype(spec.dtype))
    return out


def check_merged(sources: dict[str, Path], merged: Path, cfg: ModelConfig, opener, *,
                 seed: int = 0) -> dict[str, dict[str, dict[str, Any]]]:
    """{branch: {output group: worst max-abs difference, the reference's largest |value|, its
    bound (compare.reorder_bound through the decoder's blocks), the case}}: the merged graph at
    use_cache_branch False against decoder_model.onnx, at True against
    decoder_with_past_model.onnx, on seq2seq_checks' random inputs over its grid (sessions by
    `opener`). A cached step's cross-attention outputs must be empty; ValueError for an output
    of another shape."""
    rng = np.random.default_rng(seed)
    cases = check_cases(cfg)
    runs = {role: [(c, graph_feeds(cfg, role, c, rng)) for c in role_cases(role, cases, cfg)]
            for role in ROLES}
    expected = {}
    for role in ROLES:
        sess = opener(sources[role])
        names = [o.name for o in sess.get_outputs()]
        expected[role] = [dict(zip(names, sess.run(names, f))) for _, f in runs[role]]
        del sess
    sess = opener(merged)
    names = [o.name for o in sess.get_outputs()]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for role in ROLES:
        worst: dict[str, dict[str, Any]] = {}
        for (case, f), want in zip(runs[role], expected[role]):
            at = dict(zip(CASE_KEYS, case))
            for name, y in zip(names, sess.run(names, merged_feeds(cfg, role, f))):
                x = want.get(name)
                if x is None:  # a cached step's cross-attention output
                    if y.size:
                        raise ValueError(f"{name}: shape {y.shape} on a cached step, where it "
                                         f"is empty (the first step's is kept), at {at}")
                    continue
                if x.shape != y.shape:
                    raise ValueError(f"{name}: shape {y.shape} where {sources[role].name} gives "
                                     f"{x.shape}, at {at}")
                note_worst(worst, name, x, y, at)
        for w in worst.values():
            w["bound"] = reorder_bound(cfg, w["magnitude"], cfg.decoder_layers)
        out[BRANCH[role]] = worst
    return out
