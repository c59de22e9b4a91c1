"""4-bit blocks calibrated on activations: the activation-aware scales (awq.py) and mixed
precision within a byte budget, before quantize_weights rounds the graph (torch-free).

    fp32 graph ──awq: scales folded (awq.py)──▶ fp32 graph'
        ──each weight table alone at 4 bits, the rest fp32: KL(fp32 ‖ that) of the logits on
          calibration windows (its sensitivity)──▶ tables ranked by KL per byte that 8 bits
          add ──kept at 8 bits while the model file stays within max_bytes──▶ keep_8bit

As llama.cpp's k-quants and the GenAI builder's k_quant_mixed keep chosen tensors wider, but
chosen by measurement on this model, within the bytes the caller gives. A tied table (the
embedding and the lm_head) is one table: 8 bits for both readers (blockquant.py).
The calibration windows come from the training split of the built-in corpus or --data
(qdq.calibration_batches, as static INT8 calibrates), never the held-out text.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from tinyt.errors import QuantizeError
from tinyt.recipe import QuantRecipe

from . import awq
from .blockquant import (
    _output_rows,
    _weight_of,
    block_quantize,
    dequantize,
    excluded_by,
    module_of,
    pick_block,
)

SENSITIVITY_WINDOWS = 2  # calibration windows each table's KL is measured on (x 128 tokens)
# bytes a table's initializers and node add beyond their data (names, dims, attributes):
# ~150 measured on SmolLM2's; the file is checked against max_bytes once written
_TABLE_OVERHEAD = 512


@dataclass
class Table:
    """One weight initializer quantize_weights makes one table of."""
    weight: str
    module: str  # the name keep_8bit takes (a tied table: its matmul reader's, 'lm_head')
    rows: int  # N: outputs (or ids)
    K: int
    block: int
    transposed: bool  # the initializer holds rows as [N, K] (else [K, N]: x @ W)


def table_bytes(rows: int, K: int, bits: int, block: int, scheme: str) -> int:
    """Bytes of a MatMulNBits table: packed levels, fp32 scales, packed 4-bit zero points."""
    nb = K // block
    zeros = rows * ((nb + 1) // 2) if bits == 4 and scheme == "asymmetric" else 0
    return rows * K * bits // 8 + rows * nb * 4 + zeros


def tables(proto: onnx.ModelProto, recipe: QuantRecipe) -> list[Table]:
    """The tables quantize_weights makes of `proto` under `recipe` (excluded modules and
    weights without a block left out), one per initializer however many nodes read it."""
    inits = {i.name: i for i in proto.graph.initializer}
    transposed = {n.output[0]: n.input[0] for n in proto.graph.node
                  if n.op_type == "Transpose" and n.input[0] in inits}
    found: dict[str, Table] = {}
    for node in proto.graph.node:
        weight, through = _weight_of(node, inits, transposed)
        if weight is None:
            continue
        module = module_of(node, weight)
        if excluded_by(module, list(recipe.exclude)):
            continue
        dims = tuple(inits[weight].dims)
        layout = _output_rows(node, np.empty(dims, np.float32), through)
        if isinstance(layout, str) or pick_block(layout[1], recipe.block_size) is None:
            continue
        N, K = layout[0].shape[0], layout[1]
        known = found.get(weight)
        if known is None or (known.module != module and node.op_type != "Gather"):
            found[weight] = Table(weight, module, N, K, pick_block(K, recipe.block_size),
                                  dims == (N, K))
    return list(found.values())


def _rounded(init: onnx.TensorProto, t: Table, recipe: QuantRecipe) -> np.ndarray:
    """The weight as the recipe's 4-bit table gives it back, in the initializer's layout."""
    w = numpy_helper.to_array(init)
    rows = w if t.transposed else w.T
    q, s, z = block_quantize(np.ascontiguousarray(rows), 4, t.block, recipe.scheme,
                             recipe.scale_search)
    back = dequantize(q, s, 4, z)
    return back if t.transposed else np.ascontiguousarray(back.T)


def sensitivities(proto: onnx.ModelProto, recipe: QuantRecipe, found: list[Table],
                  feeds: dict[str, np.ndarray], *, threads: int = 1) -> dict[str, float]:
    """KL(fp32 ‖ only this table at 4 bits) of the next-token distributions, mean over every
    position of `feeds`, per table's weight: one session whose weights are graph inputs, each
    run feeding one table rounded."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    inits = {i.name: i for i in probe.graph.initializer}
    for t in found:  # an initializer listed as an input may be fed instead (IR >= 4)
        probe.graph.input.append(helper.make_tensor_value_info(
            t.weight, onnx.TensorProto.FLOAT, list(inits[t.weight].dims)))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(probe.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    del probe

    def logprobs(extra: dict) -> np.ndarray:
        z = sess.run(["logits"], {**feeds, **extra})[0].astype(np.float64)
        return z - np.logaddexp.reduce(z, axis=-1, keepdims=True)

    ref = logprobs({})
    p = np.exp(ref)
    out = {}
    for t in found:
        lq = logprobs({t.weight: _rounded(inits[t.weight], t, recipe)})
        out[t.weight] = float((p * (ref - lq)).sum(axis=-1).mean())
    return out


def choose(found: list[Table], sens: dict[str, float], recipe: QuantRecipe,
           base_bytes: int) -> tuple[list[Table], int]:
    """The tables kept at 8 bits: most KL per added byte first, each taken while the file's
    estimate stays within recipe.max_bytes (the tables keep_8bit names already are). Returns
    them and the estimate."""
    forced = [t for t in found if excluded_by(t.module, list(recipe.keep_8bit))]
    extra = {t.weight: table_bytes(t.rows, t.K, 8, t.block, "symmetric")
             - table_bytes(t.rows, t.K, 4, t.block, recipe.scheme) for t in found}
    total = base_bytes + sum(extra[t.weight] for t in forced)
    if total > recipe.max_bytes:
        raise QuantizeError(f"max_bytes={recipe.max_bytes:,}: the model at 4 bits"
                            f"{' with --keep-8bit' if forced else ''} is already ~{total:,} "
                            "bytes; raise the budget or use larger blocks")
    chosen = list(forced)
    for t in sorted(found, key=lambda t: -sens[t.weight] / extra[t.weight]):
        if t not in chosen and total + extra[t.weight] <= recipe.max_bytes:
            chosen.append(t)
            total += extra[t.weight]
    return chosen, total


def calibrate(proto: onnx.ModelProto, recipe: QuantRecipe,
              batches: list[dict[str, np.ndarray]], *, threads: int = 1
              ) -> tuple[QuantRecipe, dict]:
    """Rewrite `proto` (fp32) in place with the recipe's activation-aware scales and return the
    recipe quantize_weights then takes (keep_8bit grown by the mixed-precision choice) with
    the manifest's record of both."""
    record: dict = {"calibration_batches": len(batches)}
    if recipe.awq:
        record["awq"] = awq.apply_scales(proto, recipe, batches, threads=threads)
    if recipe.max_bytes is None:
        return recipe, record
    found = tables(proto, recipe)
    feeds = {k: v[:SENSITIVITY_WINDOWS] for k, v in batches[0].items()}
    sens = sensitivities(proto, recipe, found, feeds, threads=threads)
    inits = {i.name: i for i in proto.graph.initializer}
    fp32 = sum(int(np.prod(inits[t.weight].dims)) * 4 for t in found)
    base = proto.ByteSize() - fp32 + sum(table_bytes(t.rows, t.K, 4, t.block, recipe.scheme)
                                         for t in found) + _TABLE_OVERHEAD * len(found)
    chosen, estimate = choose(found, sens, recipe, base)
    record["mixed"] = {
        "max_bytes": recipe.max_bytes, "estimated_bytes": estimate,
        "kept_8bit": [t.module for t in chosen],
        "sensitivity_kl": {t.module: sens[t.weight] for t in found},
        "measured_on": f"{SENSITIVITY_WINDOWS} calibration windows, every position"}
    keep = tuple(dict.fromkeys([*recipe.keep_8bit, *(t.module for t in chosen)]))
    return dataclasses.replace(recipe, keep_8bit=keep), record
