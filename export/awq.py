"""Activation-aware scales for 4-bit blocks (AWQ, Lin et al. 2023), on the fp32 graph before
quantize_weights rounds it (torch-free).

A weight matmul y = x @ W [K, N] is the same product as (x / s) @ (s · W) for any positive
scales s [K] per input channel. Rounding s · W to 4-bit blocks spends the levels of each
block on the rows s enlarges, so input channels that carry large activations lose less.
Per matmul, s = mean|x|^α (normalized so that √(max·min) = 1), with α from ALPHAS picked for
the least output error ‖X W − (X / s) Q(s · W)‖² on calibration rows X (α = 0 is plain
rounding, so the pick is never worse on them). 1 / s then goes where the graph allows:

    norm ──x──▶ MatMul(W)             gamma / s   (SimplifiedLayerNormalization, Skip...:
                                                   the norm's weight, read by it alone)
    Split(MatMul(U))[k] ──Mul──▶ MatMul(W)    U's columns of part k / s   (gated MLPs: a
                                                   column of U is a row of its 4-bit table,
                                                   scaled whole, so its rounding is unchanged)
    anything else ──Mul(1 / s)──▶ MatMul(W)   a Mul node on the activation side (attention's
                                                   output: folding into V would change the
                                                   KV cache the graph returns)

A tied table (a Gather and a transposed MatMul reading one initializer) is not scaled: the
embedding would change with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from tinyt.recipe import QuantRecipe

from .blockquant import block_quantize, dequantize, module_of, pick_block

ALPHAS = np.arange(0.0, 1.0, 0.1)  # exponents tried per matmul (AWQ's grid is 20 in [0, 1))
SAMPLE_ROWS = 512  # calibration rows kept per matmul input for the output error
# op -> (its gamma input, its beta input added after the scaling, if it has one)
_NORMS = {"SimplifiedLayerNormalization": (1, None), "SkipSimplifiedLayerNormalization": (2, None),
          "LayerNormalization": (1, 2), "SkipLayerNormalization": (2, 3)}


@dataclass
class Activations:
    """One matmul input over the calibration set: mean |x| per channel and sampled rows."""
    mean_abs: np.ndarray  # [K] float64
    rows: np.ndarray  # [<= SAMPLE_ROWS, K] float32


def scalable_matmuls(proto: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Plain MatMul(x, W) nodes whose W [K, N] is an fp32 initializer read by that node alone,
    grouped by their input x (the nodes of one group share one s)."""
    inits = {i.name: i for i in proto.graph.initializer}
    readers: dict[str, int] = {}
    for n in proto.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    groups: dict[str, list[onnx.NodeProto]] = {}
    for n in proto.graph.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" else None
        if w is not None and len(w.dims) == 2 and w.data_type == onnx.TensorProto.FLOAT \
                and readers[w.name] == 1 and w.dims[0] % 16 == 0:  # K: a block of 16 at least
            groups.setdefault(n.input[0], []).append(n)
    return groups


def collect(proto: onnx.ModelProto, batches: list[dict[str, np.ndarray]],
            inputs: list[str], *, threads: int = 1) -> dict[str, Activations]:
    """Run the fp32 graph on the calibration batches, returning each named tensor's
    Activations (rows sampled evenly over every batch)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    known = {o.name for o in probe.graph.output}
    for name in inputs:
        if name not in known:
            probe.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                                    None))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    sums: dict[str, np.ndarray] = {}
    rows: dict[str, list[np.ndarray]] = {n: [] for n in inputs}
    count = 0
    per_batch = max(1, SAMPLE_ROWS // len(batches))
    for feeds in batches:
        outs = dict(zip(inputs, sess.run(inputs, feeds)))
        for name, x in outs.items():
            x = x.reshape(-1, x.shape[-1])
            sums[name] = sums.get(name, 0) + np.abs(x).astype(np.float64).sum(axis=0)
            pick = np.linspace(0, len(x) - 1, min(per_batch, len(x))).astype(int)
            rows[name].append(x[pick].astype(np.float32))
        count += len(x)
    return {n: Activations(sums[n] / count, np.concatenate(rows[n])) for n in inputs}


def _rounded(w: np.ndarray, recipe: QuantRecipe) -> np.ndarray:
    """W [K, N] through the recipe's 4-bit blocks along K (plain rounding: the search of the
    scale per block is left to the final quantization), back to fp32."""
    blk = pick_block(w.shape[0], recipe.block_size)
    q, s, z = block_quantize(np.ascontiguousarray(w.T), 4, blk, recipe.scheme, False)
    return dequantize(q, s, 4, z).T


def search(act: Activations, weights: list[np.ndarray],
           recipe: QuantRecipe) -> tuple[float, np.ndarray, float, float]:
    """(α, s [K], error at α, error at α = 0) for the matmuls sharing one input."""
    x = act.rows.astype(np.float32)
    want = [x @ w for w in weights]
    mean = np.maximum(act.mean_abs, 1e-8)
    best = None
    for alpha in ALPHAS:
        s = mean ** alpha
        s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
        err = sum(float(np.square(y - (x / s) @ _rounded(w * s[:, None], recipe)).sum())
                  for y, w in zip(want, weights))
        if best is None:
            plain = err
        if best is None or err < best[2]:
            best = (float(alpha), s, err)
    return best[0], best[1], best[2], plain


def apply_scales(proto: onnx.ModelProto, recipe: QuantRecipe,
                 batches: list[dict[str, np.ndarray]], *, threads: int = 1) -> dict[str, dict]:
    """Search and fold activation-aware scales into `proto` in place (module docstring); the
    fp32 outputs stay those of the source up to fp32 rounding. Returns per module its α, the
    output error against plain rounding, and where 1 / s went."""
    groups = scalable_matmuls(proto)
    acts = collect(proto, batches, list(groups), threads=threads)
    inits = {i.name: i for i in proto.graph.initializer}
    record: dict[str, dict] = {}
    plan: dict[str, np.ndarray] = {}
    for x_name, nodes in groups.items():
        weights = [numpy_helper.to_array(inits[n.input[1]]) for n in nodes]
        if any(pick_block(w.shape[0], recipe.block_size) is None for w in weights):
            continue
        alpha, s, err, plain = search(acts[x_name], weights, recipe)
        if alpha > 0:
            plan[x_name] = s
        for n in nodes:
            record[module_of(n, n.input[1])] = {
                "alpha": round(alpha, 2), "output_error_vs_plain": err / plain if plain else 1.0}
    for x_name, where in fold(proto, plan).items():
        for n in groups[x_name]:
            record[module_of(n, n.input[1])]["inverse_scales_in"] = where
    return record


def fold(proto: onnx.ModelProto, plan: dict[str, np.ndarray]) -> dict[str, str]:
    """Scale the weights read from each input x of `plan` by s [K] per row, and put 1 / s on x
    (module docstring): the same products in fp32. Returns where each 1 / s went."""
    groups = scalable_matmuls(proto)
    inits = {i.name: i for i in proto.graph.initializer}
    where = {}
    for x_name, s in plan.items():
        for n in groups[x_name]:
            w = numpy_helper.to_array(inits[n.input[1]])
            inits[n.input[1]].CopyFrom(numpy_helper.from_array(w * s[:, None], n.input[1]))
        where[x_name] = _fold(proto, inits, x_name, groups[x_name], s)
    return where


def _fold(proto: onnx.ModelProto, inits: dict, x_name: str, nodes: list[onnx.NodeProto],
          s: np.ndarray) -> str:
    """Put 1 / s on x: into the producing norm's gamma, a producing matmul's columns, or a
    new Mul node. Returns where it went."""
    graph = proto.graph
    producer = {o: n for n in graph.node for o in n.output}
    readers = [n for n in graph.node if x_name in n.input]
    users = {}
    for n in graph.node:
        for i in n.input:
            users[i] = users.get(i, 0) + 1
    p = producer.get(x_name)
    only_group = len(readers) == len(nodes) and x_name not in {o.name for o in graph.output}
    if p is not None and only_group and p.op_type in _NORMS and p.output[0] == x_name:
        g_at, b_at = _NORMS[p.op_type]
        owned = [p.input[i] for i in (g_at, b_at) if i is not None and i < len(p.input)
                 and p.input[i]]  # gamma, and beta where the norm adds one
        if all(n in inits and users[n] == 1 for n in owned):
            for n in owned:
                inits[n].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(inits[n]) / s, n))
            return f"{' and '.join(owned)} (the norm's weight{'s' if len(owned) > 1 else ''})"
    if p is not None and only_group and p.op_type == "Mul":
        folded = _fold_columns(graph, inits, producer, users, p, x_name, s)
        if folded:
            return folded
    inv = numpy_helper.from_array((1 / s).astype(np.float32), f"{x_name}_awq_inverse_scales")
    graph.initializer.append(inv)
    scaled = f"{x_name}_awq_scaled"
    for n in nodes:
        n.input[0] = scaled
    first = min(i for i, n in enumerate(graph.node) if n in nodes)
    graph.node.insert(first, helper.make_node("Mul", [x_name, inv.name], [scaled],
                                              name=f"{nodes[0].name}_AwqScale"))
    return f"Mul node {nodes[0].name}_AwqScale (activation side)"


def _fold_columns(graph, inits, producer, users, mul, x_name, s) -> str | None:
    """x = a * b where b is part k of Split(MatMul(h, U)) along the last axis, or
    MatMul(h, U) itself, each read once: U's columns of b divided by s."""
    for b in mul.input:
        p, split = producer.get(b), None
        if users.get(b) != 1 or p is None:
            continue
        if p.op_type == "Split" and users.get(p.input[0]) == 1:
            split, p = p, producer.get(p.input[0])
        if p is None or p.op_type != "MatMul" or p.input[1] not in inits \
                or users.get(p.input[1]) != 1:
            continue
        u = numpy_helper.to_array(inits[p.input[1]]).copy()
        lo = 0 if split is None else _split_start(split, inits, b, u.shape[1])
        if lo is None or lo + len(s) > u.shape[1] or (split is None and len(s) != u.shape[1]):
            continue
        u[:, lo:lo + len(s)] /= s
        inits[p.input[1]].CopyFrom(numpy_helper.from_array(u, p.input[1]))
        return f"{p.input[1]} columns {lo}..{lo + len(s) - 1} (the matmul making {b})"
    return None


def _split_start(split: onnx.NodeProto, inits: dict, part: str, width: int) -> int | None:
    """Where output `part` of a Split along the last axis begins (None: another axis, or
    sizes the graph does not hold as constants)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in split.attribute}
    if attrs.get("axis", 0) not in (-1, 2):
        return None
    sizes = attrs.get("split")
    if sizes is None and len(split.input) > 1 and split.input[1]:
        if split.input[1] not in inits:
            return None
        sizes = numpy_helper.to_array(inits[split.input[1]]).tolist()
    if sizes is None:  # equal parts (opset 18's num_outputs, or none said)
        sizes = [width // len(split.output)] * len(split.output)
    return int(sum(sizes[:list(split.output).index(part)]))
