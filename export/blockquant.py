"""Block-wise weight quantization of a graph's weight matmuls and embedding gathers (torch-free).

Every weight MatMul becomes ONNX Runtime's MatMulNBits (weights int8 or int4 in blocks along K,
one fp32 scale per block, symmetric or with a zero point per block: SCHEMES; accuracy_level 4
quantizes activations to int8 at run time, so the products run on int8 dot-product units).
The tied embedding / lm_head matrix is quantized once and read by both of its users:

    W [V, C] fp32  ──▶  Wq [V, C/bs, bs·bits/8] uint8 + scales [V, C/bs]   (stored once)
      lm_head:  x ──MatMulNBits(Wq, scales, K=C, N=V)──▶ logits
      wte:      ids ──GatherBlockQuantized(Reshape(Wq → [V, C·bits/8]), scales)──▶ embeddings

Activation x activation matmuls (inside attention) stay float.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tinyt.graphio import CONTRIB_DOMAIN
from tinyt.recipe import SCHEMES, QuantRecipe

from .gguf_blocks import BITS, BLOCK, carried_table
from .kvfuse import drop_dead


@dataclass
class QuantReport:
    quantized: list[str] = field(default_factory=list)  # "module (op)" now quantized
    excluded: list[str] = field(default_factory=list)  # left float on request
    exclusions_used: set[str] = field(default_factory=set)  # the --exclude names that matched
    skipped: dict[str, str] = field(default_factory=dict)  # node -> why it stayed float
    shared_tables: list[str] = field(default_factory=list)  # initializers read by 2 ops
    kept_8bit: list[str] = field(default_factory=list)  # "module (op)" at 8 bits in a 4-bit run
    keep_8bit_used: set[str] = field(default_factory=set)  # the keep_8bit names that matched
    modules: set[str] = field(default_factory=set)  # every module holding a weight node
    carried: list[str] = field(default_factory=list)  # "module (GGUF type)" taken as stored
    not_carried: dict[str, str] = field(default_factory=dict)  # module -> why the recipe's
    rounded: list[str] = field(default_factory=list)  # "node (q8_0|q8_1)": llama.cpp's rounding
    double_norms: int = 0  # RMSNorm means taken in double, as ggml's (--activations q8)
    calibrated: dict = field(default_factory=dict)  # awq / mixed precision (export/mixed.py)


# How a block's values map to 2^bits levels (tinyt.recipe.SCHEMES; one fp32 scale per block;
# `zero point` = the level of 0.0):
#   symmetric       scale = absmax / (2^(bits-1) - 1): 2^bits - 1 levels, the extremes of both
#                   signs exact, the zero point 2^(bits-1) implied (the ops' default)
#   symmetric-full  scale = -(the block's largest-magnitude value) / 2^(bits-1): that value at
#                   the lowest level, all 2^bits levels used (llama.cpp's q4_0 / q8_0, ONNX
#                   Runtime's own quantizer); the scale's sign is the value's
#   asymmetric      scale = (max - min) / (2^bits - 1) over the block's range (0 included), a
#                   zero point per block stored beside the scales (llama.cpp's q4_1)
# scale_search: each block's scale is the one of SEARCH_FACTORS x the above that gives the least
# squared error over the block (clipping the largest values where that rounds the rest finer).
# Weight error at llama-demo (relative squared error, 4 bits, blocks of 32 / 128):
#   symmetric 0.0093 / 0.0139, symmetric-full 0.0073 / 0.0108, asymmetric 0.0064 / 0.0100;
#   with the search 0.0065 / 0.0094 (symmetric-full) and 0.0060 / 0.0089 (asymmetric).
SEARCH_FACTORS = np.linspace(0.6, 1.15, 23)
_CHUNK = 1 << 22  # values quantized at a time: the temporaries stay ~100 MB for any table


def block_quantize(rows: np.ndarray, bits: int, block: int, scheme: str = "symmetric",
                   scale_search: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Block quantization of `rows` [N, K] along K (SCHEMES above).
    Returns packed uint8 [N, K/block, block*bits/8] (low bits first), fp32 scales [N, K/block]
    and, for 'asymmetric', zero points packed as MatMulNBits reads them ([N, ceil(K/block *
    bits/8)], low bits first) — else None (the implied 2^(bits-1))."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r} is not one of {', '.join(SCHEMES)}")
    N, K = rows.shape
    nb = K // block
    q = np.empty((N, nb, block), np.uint8)
    scales = np.empty((N, nb), np.float32)
    zeros = np.empty((N, nb), np.uint8)
    step = max(1, _CHUNK // max(K, 1))
    for r in range(0, N, step):
        x = rows[r:r + step].reshape(-1, nb, block).astype(np.float32)
        q[r:r + step], scales[r:r + step], zeros[r:r + step] = _quantize_blocks(
            x, bits, scheme, scale_search)
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)
    if scheme != "asymmetric":
        return q, scales, None
    if bits == 4:
        if nb % 2:
            zeros = np.concatenate([zeros, np.zeros((N, 1), np.uint8)], axis=1)
        zeros = zeros[:, 0::2] | (zeros[:, 1::2] << 4)
    return q, scales, np.ascontiguousarray(zeros)


def _quantize_blocks(x: np.ndarray, bits: int, scheme: str,
                     scale_search: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Levels (uint8, unpacked), scales and zero points of blocks x [..., block]."""
    top, mid = 2 ** bits - 1, 2 ** (bits - 1)
    if scheme == "asymmetric":
        lo = np.minimum(x.min(axis=-1), 0)
        base = (np.maximum(x.max(axis=-1), 0) - lo) / top
    elif scheme == "symmetric-full":
        extreme = np.take_along_axis(x, np.abs(x).argmax(axis=-1)[..., None], axis=-1)[..., 0]
        base = extreme / -mid
    else:
        base = np.abs(x).max(axis=-1) / (mid - 1)
    base[base == 0] = 1.0

    # the level of 0.0: the same for every scale tried (the range shrinks about it)
    zero = np.clip(np.rint(-lo / base), 0, top) if scheme == "asymmetric" else \
        np.full(base.shape, mid, np.float32)

    def levels(scale):
        return np.clip(np.rint(x / scale[..., None]) + zero[..., None], 0, top)

    if not scale_search:
        return levels(base).astype(np.uint8), base.astype(np.float32), zero.astype(np.uint8)
    best_q = best_s = best_e = None
    for f in SEARCH_FACTORS:
        scale = (base * np.float32(f)).astype(np.float32)
        q = levels(scale)
        err = np.square((q - zero[..., None]) * scale[..., None] - x).sum(axis=-1)
        if best_e is None:
            best_q, best_s, best_e = q, scale, err
            continue
        better = err < best_e
        best_q = np.where(better[..., None], q, best_q)
        best_s, best_e = np.where(better, scale, best_s), np.minimum(err, best_e)
    return best_q.astype(np.uint8), best_s.astype(np.float32), zero.astype(np.uint8)


def dequantize(packed: np.ndarray, scales: np.ndarray, bits: int,
               zero_points: np.ndarray | None = None) -> np.ndarray:
    """Inverse of block_quantize, [N, K] float32 (for tests and error estimates)."""
    q = packed
    if bits == 4:
        q = np.stack([q & 0x0F, q >> 4], axis=-1).reshape(*q.shape[:-1], -1)
    zero = np.float32(2 ** (bits - 1))
    if zero_points is not None:
        z = zero_points
        if bits == 4:
            z = np.stack([z & 0x0F, z >> 4], axis=-1).reshape(z.shape[0], -1)
        zero = z[:, :scales.shape[1], None].astype(np.float32)
    x = (q.astype(np.float32) - zero) * scales[..., None]
    return x.reshape(x.shape[0], -1)


def pick_block(K: int, block: int) -> int | None:
    """The requested block if it divides K, else the largest power of two >= 16 that does."""
    b = block
    while b >= 16:
        if K % b == 0:
            return b
        b //= 2
    return None


def module_of(node: onnx.NodeProto, weight: str) -> str:
    """The PyTorch module a weight node came from: from its name (/transformer/h.0/attn/c_attn/
    MatMul -> transformer.h.0.attn.c_attn), or, for nodes ONNX Runtime created and named itself,
    from its weight's name (model.lm_head.weight -> lm_head)."""
    if node.name.startswith("/"):
        return ".".join(node.name.strip("/").split("/")[:-1])
    return weight.removeprefix("model.").removesuffix(".weight")


def excluded_by(module: str, exclude: list[str]) -> str | None:
    """The exclusion ('lm_head', 'transformer.h.0', 'h.0', 'mlp') that covers `module`."""
    dotted = f".{module}."
    return next((m for m in exclude if f".{m.strip('.')}." in dotted), None)


def channel_quantize(w: np.ndarray, qmax: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 of w [K, N]: (int8 [K, N], scales [N])."""
    scales = np.abs(w).max(axis=0) / qmax
    scales[scales == 0] = 1.0
    q = np.clip(np.rint(w / scales), -qmax, qmax).astype(np.int8)
    return q, scales.astype(np.float32)


def quantize_weights(proto: onnx.ModelProto, recipe: QuantRecipe,
                     gguf: dict[str, tuple[str, np.ndarray]] | None = None, *,
                     head_gemm: bool = False) -> QuantReport:
    """Rewrite `proto` in place as the (dynamic or weight-only) recipe says; see the module
    docstring. Returns what was done. head_gemm (with an int8 GEMM kernel): the tied lm_head
    becomes an int8 GEMM too, with a per-channel table of its own beside the embedding's
    block table (an encoder-decoder's: at 32 rows a step, 32 x 512 x 58,101, MatMulNBits at
    8 bits took 161 ms and DynamicQuantizeMatMul 62 ms on an AVX2 EPYC, 55% of a qgemm
    decoder step before). The recipe's fields:

    keep_8bit (with bits=4): modules whose weights stay at 8 bits ('lm_head', 'h.0', as
    exclude names them), as GenAI's builder keeps its last matmul or shared embeddings at int8.
    A table read by two modules (the tied embedding / lm_head) is quantized once, at the
    widest width any of its readers asks for: 'lm_head' keeps the tied table at 8 bits for
    the embedding lookup too.

    kernel='qgemm': the layers' own weight matmuls (not the tied table, whose two users keep
    sharing one MatMulNBits table) become DynamicQuantizeMatMul instead — int8 weights with
    one scale per output channel, activations quantized per tensor at run time (per row for
    ROW_SCALED modules, through MatMulInteger), products in ONNX Runtime's int8 GEMM (MLAS
    QGEMM). On a prompt it is 2.7-3x faster than MatMulNBits
    (127 x 128 x 384: 44 vs 128 us; 127 x 768 x 2304: 1.08 vs 2.99 ms), equal on one row.
    kernel='qgemm-rows': the same, with every activation row (token) quantized with its own
    scale, so a row's result never depends on the other rows of its batch: the graph that
    serving batches prompts and steps with (runtime/engine.py). On a prompt of 32 rows
    (32 x 768 x 3072, in cache) 151 us vs 349 us per tensor and 444 us for MatMulNBits; on 8
    rows 62 vs 280 vs 121 us (Xeon AMX, 2 threads).
    reduce_range: 7-bit weights, for x86 without VNNI, whose u8 x s8 products can saturate.
    scheme / scale_search: how each block's values map to levels (SCHEMES). The scheme shapes
    the 4-bit tables; an 8-bit table (kept by keep_8bit) stays symmetric, the form whose
    products tinyt/int8.py records exact on every CPU; the scale search applies to both.

    gguf: a GGUF import's blocks by checkpoint weight name (tinyt.hf.gguf.read_blocks): a
    weight with blocks becomes the table export/gguf_blocks.py makes of them, at their width
    (Q8_0: 8 bits), once they are checked to dequantize to the graph's fp32 weight."""
    # accuracy_level: dynamic 4, weight-only 0, static None
    if recipe.accuracy_level is None or recipe.block_size is None:
        raise ValueError("quantize_weights makes MatMulNBits and int8 GEMM graphs; a static "
                         "recipe is export/qdq.py's")
    graph = proto.graph
    report = QuantReport()
    rewrite = _Rewrite(graph, recipe, report, gguf or {}, head_gemm=head_gemm)
    new_nodes = [new for node in graph.node for new in rewrite.replace(node)]
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(rewrite.new_inits)
    if rewrite.head_gemm:
        _fold_bias(graph)
    drop_dead(graph)  # the lm_head's Transpose, and the fp32 weights nothing reads any more
    users: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    report.shared_tables = sorted(q for q, *_ in rewrite.tables.values() if users.get(q, 0) > 1)
    if not any(o.domain == CONTRIB_DOMAIN for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return report


class _Rewrite:
    """One quantize_weights run over a graph: each node's replacement (replace), the
    block-quantized tables made so far (each once however many nodes read it) and the new
    initializers, with what was done recorded in `report`."""

    def __init__(self, graph: onnx.GraphProto, recipe: QuantRecipe, report: QuantReport,
                 gguf: dict[str, tuple[str, np.ndarray]], *, head_gemm: bool = False):
        self.recipe, self.report = recipe, report
        self.head_gemm = head_gemm and recipe.int8_gemm
        self.exclude, keep_8bit = list(recipe.exclude), list(recipe.keep_8bit)
        self.inits = {i.name: i for i in graph.initializer}
        self.tables: dict[str, tuple[str, str, str | None]] = {}  # weight -> (q, scales, zeros)
        self.new_inits: list[onnx.TensorProto] = []
        # MatMul(x, Transpose(W)) is x @ W^T, the tied lm_head as exported: read W directly.
        self.transposed = {
            n.output[0]: n.input[0] for n in graph.node
            if n.op_type == "Transpose" and n.input[0] in self.inits
            and [helper.get_attribute_value(a) for a in n.attribute] in ([], [[1, 0]])}
        self.width: dict[str, int] = {}  # weight -> its table's bits: the widest any reader asks
        self.gguf = _gguf_weights(graph, self.inits, self.transposed, gguf, report)
        for node in graph.node:
            weight, _ = _weight_of(node, self.inits, self.transposed)
            if weight in self.gguf:
                self.width[weight] = BITS[self.gguf[weight][0]]
            elif weight is not None:
                keep = excluded_by(module_of(node, weight), keep_8bit)
                if keep:
                    report.keep_8bit_used.add(keep)
                self.width[weight] = max(self.width.get(weight, recipe.bits),
                                         8 if keep else recipe.bits)

    def replace(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """What stands for `node` in the quantized graph: itself where it stays float."""
        recipe, report = self.recipe, self.report
        # 1) the node's fp32 weight matrix, if it has one
        weight, through_transpose = _weight_of(node, self.inits, self.transposed)
        if weight is None:
            return [node]
        # 2) excluded by the caller?
        module = module_of(node, weight)
        report.modules.add(module)
        why = excluded_by(module, self.exclude)
        if why:
            report.excluded.append(f"{module} ({node.op_type}, by '{why}')")
            report.exclusions_used.add(why)
            return [node]
        # 3) the matrix as rows of outputs, and a block size that divides their length
        w = numpy_helper.to_array(self.inits[weight])
        layout = _output_rows(node, w, through_transpose)
        blk = None if isinstance(layout, str) else pick_block(layout[1], recipe.block_size)
        if isinstance(layout, str) or blk is None:
            report.skipped[node.name] = layout if isinstance(layout, str) else \
                f"K={layout[1]} has no power-of-two block >= 16"
            return [node]
        rows, K = layout
        # 4) the replacement: int8 per channel (qgemm), or a block-quantized table
        own = node.op_type == "MatMul" and not through_transpose and weight not in self.tables
        if recipe.int8_gemm and (own or (self.head_gemm and node.op_type != "Gather")):
            per_row = recipe.row_scaled or module.endswith(ROW_SCALED)
            report.quantized.append(f"{module} ({node.op_type}, int8 per channel, activations "
                                    f"per {'row' if per_row else 'tensor'})")
            return _qgemm_nodes(node, weight, np.ascontiguousarray(rows.T), recipe.reduce_range,
                                per_row, self.new_inits)  # rows.T: W as x @ W reads it [K, N]
        names = self._table(weight, np.ascontiguousarray(rows), blk)
        report.quantized.append(f"{module} ({node.op_type})")
        if self.width[weight] != recipe.bits:
            report.kept_8bit.append(f"{module} ({node.op_type})")
        return _nbits_nodes(node, names, rows.shape[0], K, self.width[weight], blk,
                            recipe.accuracy_level, self.new_inits)

    def _table(self, name: str, rows: np.ndarray, blk: int) -> tuple[str, str, str | None]:
        """The block-quantized table of weight `name`, made once however many nodes read it:
        at 4 bits in the recipe's scheme, at 8 symmetric (the form tinyt/int8.py records
        exact)."""
        if name in self.gguf and name not in self.tables:
            kind, raw = self.gguf.pop(name)
            table = carried_table(kind, raw, rows) if blk == BLOCK else \
                f"the recipe's blocks of {blk} are not GGUF's {BLOCK}"
            if isinstance(table, str):
                self.report.not_carried[name] = table
                self.width[name] = self.recipe.bits
            else:
                self.report.carried.append(f"{name} ({kind})")
                self.new_inits.extend(numpy_helper.from_array(a, f"{name}_{part}") for a, part in
                                      ((table.packed, f"q{table.bits}"), (table.scales, "scales"),
                                       (table.zero_points, "zero_points")) if a is not None)
                self.tables[name] = (f"{name}_q{table.bits}", f"{name}_scales", None
                                     if table.zero_points is None else f"{name}_zero_points")
        if name not in self.tables:
            b, recipe = self.width[name], self.recipe
            q, s, z = block_quantize(rows, b, blk, recipe.scheme if b == 4 else "symmetric",
                                     recipe.scale_search)
            self.new_inits.extend([numpy_helper.from_array(q, f"{name}_q{b}"),
                                   numpy_helper.from_array(s, f"{name}_scales")])
            if z is not None:
                self.new_inits.append(numpy_helper.from_array(z, f"{name}_zero_points"))
            self.tables[name] = (f"{name}_q{b}", f"{name}_scales",
                                 None if z is None else f"{name}_zero_points")
        return self.tables[name]


def _gguf_weights(graph: onnx.GraphProto, inits: dict, transposed: dict,
                  gguf: dict[str, tuple[str, np.ndarray]], report: QuantReport
                  ) -> dict[str, tuple[str, np.ndarray]]:
    """The GGUF blocks by the graph's weight initializer, found through the module a node
    reads it in (its checkpoint name: module + '.weight'; the tied table by the embedding's);
    a table with float zero points (Q4_1) is left out where a Gather reads it
    (GatherBlockQuantized takes packed integer zero points)."""
    out, gathered = {}, set()
    for node in graph.node:
        weight, _ = _weight_of(node, inits, transposed)
        if weight is None:
            continue
        if node.op_type == "Gather":
            gathered.add(weight)
        found = gguf.get(f"{module_of(node, weight)}.weight")
        if found is not None:
            out.setdefault(weight, found)
    for weight in sorted(gathered & set(out)):
        if out[weight][0] == "Q4_1":
            report.not_carried[weight] = "Q4_1's float zero points: a Gather reads this table"
            del out[weight]
    return out


def _weight_of(node: onnx.NodeProto, inits: dict, transposed: dict) -> tuple[str | None, bool]:
    """(name of the 2-D fp32 initializer a MatMul / FusedMatMul / Gather reads, whether it is
    read through a Transpose), or (None, False)."""
    weight = node.input[1] if node.op_type in ("MatMul", "FusedMatMul") else (
        node.input[0] if node.op_type == "Gather" else None)
    through_transpose = node.op_type == "MatMul" and weight in transposed
    if through_transpose:
        weight = transposed[weight]
    init = inits.get(weight) if weight else None
    if init is None or len(init.dims) != 2 or init.data_type != onnx.TensorProto.FLOAT:
        return None, False
    return weight, through_transpose


def _fold_bias(graph: onnx.GraphProto) -> None:
    """A constant bias added to a DynamicQuantizeMatMul's product (a layer's, or Marian's /
    BART's final_logits_bias over the vocabulary) moved into the op's own bias input: one
    pass over its output less (over the logits: 32 x 58,101 floats a step)."""
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type != "DynamicQuantizeMatMul" or len(node.input) != 4 \
                or node.output[0] in outputs or len(readers.get(node.output[0], [])) != 1:
            continue
        add = readers[node.output[0]][0]
        bias = next((i for i in add.input if i != node.output[0]), None)
        N = inits[node.input[2]].dims[-1]  # the channel scales: one per output
        if add.op_type != "Add" or bias not in inits or list(add.input).count(bias) != 1 \
                or int(np.prod(inits[bias].dims)) != N or inits[bias].dims[-1] != N:
            continue
        if f"{bias}_1d" not in inits:  # one copy however many products add it
            b = numpy_helper.to_array(inits[bias]).reshape(N)
            inits[f"{bias}_1d"] = numpy_helper.from_array(b, f"{bias}_1d")
            graph.initializer.append(inits[f"{bias}_1d"])
        node.input.append(f"{bias}_1d")
        node.output[0], add.output[0] = add.output[0], ""  # the Add is dead: drop_dead


def _output_rows(node: onnx.NodeProto, w: np.ndarray,
                 through_transpose: bool) -> tuple[np.ndarray, int] | str:
    """The weight as one row per output and the row length K, or why it cannot be."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Gather":
        if attrs.get("axis", 0) != 0:
            return "gathers along an axis other than 0"
        return w, w.shape[1]  # one row per token, quantized along the embedding
    if through_transpose:
        return w, w.shape[1]
    if node.op_type == "FusedMatMul":
        if attrs.get("transB") != 1 or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0:
            return f"FusedMatMul with {attrs}"
        return w, w.shape[1]  # x @ W^T: W's rows are the outputs
    return w.T, w.shape[0]  # x @ W: W^T's rows are the outputs


# Modules whose input the qgemm kernel quantizes with one scale per row (token) instead of one
# per tensor: attention's output, where a few tokens' rows are far larger than the rest (the
# first token's row is its own value vector) and set a per-tensor scale that flattens every
# other row. Measured on a 150-step GPT-2-shaped model, KL from fp32 over 12 held-out windows:
# per-tensor everywhere 5.6e-5, per-row at attn.c_proj 2.8e-5, per-row everywhere 2.3e-5
# (MatMulNBits: 1.9e-5), for +0.4% / +9% of a 128-token prompt pass; on the demo model
# 2.40e-4 / 2.13e-4 / 1.52e-4 for +4% / +18%.
ROW_SCALED = ("attn.c_proj",)


def _qgemm_nodes(node: onnx.NodeProto, weight: str, w: np.ndarray, reduce_range: bool,
                 per_row: bool, new_inits: list) -> list[onnx.NodeProto]:
    """x @ W with int8 weights per output channel and int8 activations quantized at run time:
    per tensor in one DynamicQuantizeMatMul, or (per_row) one symmetric scale per row, a u8
    offset of 128 and MatMulInteger, then both scales applied to the int32 products."""
    q, sc = channel_quantize(w, 63 if reduce_range else 127)
    qn, sn, zn = f"{weight}_s8", f"{weight}_channel_scales", f"{weight}_zero"
    new_inits.extend([numpy_helper.from_array(q, qn), numpy_helper.from_array(sc, sn)])
    name = node.name.replace("MatMul", "DynamicQuantizeMatMul")
    if not per_row:
        new_inits.append(numpy_helper.from_array(np.zeros(sc.shape, np.int8), zn))
        return [helper.make_node("DynamicQuantizeMatMul", [node.input[0], qn, sn, zn],
                                 list(node.output), name=name, domain=CONTRIB_DOMAIN)]
    name, x = node.name.replace("MatMul", "RowQuantizedMatMul"), node.input[0]
    c = {k: f"{name}/{k}" for k in ("axis", "tiny", "inv127", "offset", "zero_point")}
    new_inits.extend([numpy_helper.from_array(np.array([-1], np.int64), c["axis"]),
                      numpy_helper.from_array(np.array(1e-30, np.float32), c["tiny"]),
                      numpy_helper.from_array(np.array(1 / 127, np.float32), c["inv127"]),
                      numpy_helper.from_array(np.array(128, np.float32), c["offset"]),
                      numpy_helper.from_array(np.array(128, np.uint8), c["zero_point"])])
    steps = [  # (step, inputs: "@step" is an earlier step's output, attributes)
        ("Abs", [x], {}), ("ReduceMax", ["@Abs", c["axis"]], {"keepdims": 1}),
        ("Max", ["@ReduceMax", c["tiny"]], {}), ("Mul", ["@Max", c["inv127"]], {}),  # row scale
        ("Div", [x, "@Mul"], {}), ("Round", ["@Div"], {}), ("Add", ["@Round", c["offset"]], {}),
        ("Cast", ["@Add"], {"to": onnx.TensorProto.UINT8}),  # 1..255, zero at 128
        ("MatMulInteger", ["@Cast", qn, c["zero_point"]], {}),
        ("Cast_products", ["@MatMulInteger"], {"to": onnx.TensorProto.FLOAT}),
        ("Mul_rows", ["@Cast_products", "@Mul"], {}), ("Mul_channels", ["@Mul_rows", sn], {})]
    nodes = []
    for k, (step, inputs, attrs) in enumerate(steps):
        out = list(node.output) if k == len(steps) - 1 else [f"{name}/{step}"]
        ins = [f"{name}/{i[1:]}" if i.startswith("@") else i for i in inputs]
        nodes.append(helper.make_node(step.split("_")[0], ins, out, name=f"{name}/{step}",
                                      **attrs))
    return nodes


def _nbits_nodes(node: onnx.NodeProto, names: tuple[str, str, str | None], N: int, K: int,
                 bits: int, blk: int, accuracy_level: int,
                 new_inits: list) -> list[onnx.NodeProto]:
    """MatMulNBits for a matmul; Reshape + GatherBlockQuantized for an embedding lookup (each
    reading the table's zero points where it has them)."""
    qname, sname, zname = names
    zero = [zname] if zname else []
    if node.op_type != "Gather":
        return [helper.make_node(
            "MatMulNBits", [node.input[0], qname, sname, *zero], list(node.output),
            name=node.name.replace(node.op_type, "MatMulNBits"), domain=CONTRIB_DOMAIN, K=K,
            N=N, bits=bits, block_size=blk, accuracy_level=accuracy_level)]
    flat = f"{qname}_2d"
    shape = numpy_helper.from_array(np.array([N, K * bits // 8], dtype=np.int64), f"{flat}_shape")
    new_inits.append(shape)
    return [helper.make_node("Reshape", [qname, shape.name], [flat], name=f"{node.name}/Reshape"),
            helper.make_node("GatherBlockQuantized", [flat, node.input[1], sname, *zero],
                             list(node.output), name=f"{node.name}BlockQuantized",
                             domain=CONTRIB_DOMAIN, bits=bits, block_size=blk, gather_axis=0,
                             quantize_axis=1)]
