"""Quantization: artifact directory in, quantized artifact directory out.

    onnx/ or onnx-opt/ ──block-quantize weight matmuls + the tied table (blockquant.py)──▶
        accuracy vs the input graph on held-out corpus data ──▶ onnx-int8/ + manifest

mode 'dynamic' (default): weights int8 (or int4), activations quantized to int8 at run time by
MatMulNBits (accuracy_level 4), so products use the CPU's int8 dot-product units.
mode 'weight-only': the same weights, products in fp32 (accuracy_level 0).
mode 'static': QDQ with activation ranges calibrated on the training split (qdq.py: decoder
windows, or an encoder's or classifier's texts fed as the runtime feeds them); standard ONNX
ops, from the plain export; settings from the CPU's INT8 preset (tinyt.hardware).

An encoder (sentence embeddings) takes every mode and kernel; its accuracy report is cosine
similarity to the source's embeddings and retrieval recall@10 on queries and passages drawn
from the standard library's docstrings (accuracy.encoder_accuracy), not held-out corpus text.
A classifier's (sequence or token) is label agreement with the source on built-in text, which
needs no labels, with accuracy beside it where labelled data applies (accuracy.classifier_report).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx

from tinyt import int8
from tinyt.contract import CLASSIFIER, ENCODER, ONNX_FILE, TOKEN_CLASSIFIER
from tinyt.errors import QuantizeError
from tinyt.graphio import check_graph, graph_files, save_graph
from tinyt.hardware import int8_preset, saturates_here
from tinyt.runtime.feeds import check_tokens
from tinyt.runtime.session import Artifact, graph_session
from tinyt.tokenizer import Tokenizer

from .accuracy import classifier_report, encoder_accuracy, lm_accuracy
from .blockquant import MS, SCHEMES, quantize_weights
from .optimize import QUANTIZED_OPS
from .qdq import CALIBRATIONS, quantize_qdq
from .stage import Built, open_source, write_artifact
from .text_batches import TEXT_KINDS

MODES = {"dynamic": 4, "weight-only": 0, "static": None}  # -> MatMulNBits accuracy_level
BITS = (8, 4)
DEFAULT_BLOCK = 64
# bits -> (scheme, scale search) when the caller names neither. 4 bits: at llama-demo (block
# 32, the tied table at 8 bits) the asymmetric blocks with the search move the next token's
# distribution 38% less than symmetric ones (KL 4.7e-3 against 7.6e-3;
# benchmarks/results/int4-schemes-llama-demo-epyc-vnni) for 2.6% more bytes (zero points), and
# ONNX Runtime's 4-bit kernel reads them at the same speed (benchmarks/step_kernels.py).
# 8 bits stay symmetric: the form tinyt/int8.py records exact on every CPU.
DEFAULT_SCHEME = {4: ("asymmetric", True), 8: ("symmetric", False)}
# Weight-matmul kernels of dynamic mode: MatMulNBits (block-wise), DynamicQuantizeMatMul (per
# channel, int8 GEMM, activations per tensor), or the same GEMM with activations per row
# ("qgemm-rows": every row of a batch computed as if alone; export/blockquant.py says when each
# wins).
KERNELS = ("nbits", "qgemm", "qgemm-rows")


def _check_request(src: Path, manifest: dict, proto: onnx.ModelProto, kind: str, *, mode: str,
                   bits: int, block_size: int, kernel: str, calibration: str,
                   keep_8bit: list[str], scheme: str, scale_search: bool,
                   data: str | None) -> None:
    """Every refusal of a request that can be made before any work, each naming what is
    allowed."""
    if mode not in MODES:
        raise QuantizeError(f"mode={mode!r} is not one of {', '.join(MODES)}")
    if bits not in BITS:
        raise QuantizeError(f"bits={bits!r} is not one of {', '.join(map(str, BITS))}")
    if not (isinstance(block_size, int) and block_size >= 16
            and block_size & (block_size - 1) == 0):
        raise QuantizeError(f"block_size={block_size!r} must be a power of two >= 16")
    ops = {n.op_type for n in proto.graph.node}
    if manifest.get("stage") == "quantize" or ops & QUANTIZED_OPS:
        raise QuantizeError(f"{src} is already quantized ({sorted(ops & QUANTIZED_OPS)}); "
                            "quantize the fp32 export or optimized graph")
    if "EmbedLayerNormalization" in ops:
        raise QuantizeError(f"{src} holds EmbedLayerNormalization (optimize "
                            "--fuse-embedding), whose tables quantization does not read (they "
                            "would stay fp32); quantize the graph optimized without "
                            "--fuse-embedding")
    if mode == "static" and bits != 8:
        raise QuantizeError(f"static quantization is 8-bit only; bits={bits} is for the "
                            "dynamic and weight-only modes")
    if mode == "static" and manifest.get("stage") != "export":
        why = ("the optimized graph's constant folding turns computed matmuls (ModernBERT's "
               "rotary positions x frequencies) into matmuls of an initializer, which static "
               "quantization would take for weights" if kind in TEXT_KINDS else
               "ONNX Runtime's quantizer cannot infer shapes through fused contrib ops")
        raise QuantizeError(f"static (QDQ) quantization takes the plain export, not the output "
                            f"of stage {manifest.get('stage')!r}: {why}")
    if mode != "static" and manifest.get("options", {}).get("target") == "portable":
        raise QuantizeError(f"{src} is a 'portable' graph (standard ONNX ops only), and this "
                            "quantization uses ONNX Runtime contrib ops; quantize the export "
                            "or the 'cpu' optimized graph")
    if kernel not in KERNELS or (kernel != "nbits" and (bits != 8 or mode != "dynamic")):
        raise QuantizeError(f"kernel={kernel!r} with mode={mode!r}, bits={bits}: kernels are "
                            f"{', '.join(KERNELS)}, and the qgemm ones are for 8-bit dynamic "
                            "only")
    if keep_8bit and (bits != 4 or mode == "static" or kernel != "nbits"):
        raise QuantizeError(f"keep_8bit={list(keep_8bit)} keeps modules at 8 bits in a 4-bit "
                            f"quantization (bits=4, mode dynamic or weight-only, kernel nbits); "
                            f"this is bits={bits}, mode={mode!r}, kernel={kernel!r}")
    if scheme not in SCHEMES:
        raise QuantizeError(f"scheme={scheme!r} is not one of {', '.join(SCHEMES)}")
    if scheme != "symmetric" and bits != 4:
        raise QuantizeError(f"scheme={scheme!r} is for 4-bit blocks; 8-bit blocks stay "
                            "symmetric (the form whose int8 products are exact on every CPU, "
                            "tinyt/int8.py); use --bits 4, or --scale-search alone")
    if (scheme != "symmetric" or scale_search) and (mode == "static" or kernel != "nbits"):
        raise QuantizeError(f"scheme={scheme!r}, scale_search={scale_search} shape "
                            "MatMulNBits' blocks (mode dynamic or weight-only, kernel nbits); "
                            f"this is mode={mode!r}, kernel={kernel!r}, whose int8 weights are "
                            "symmetric per channel")
    if calibration not in CALIBRATIONS:
        raise QuantizeError(f"calibration={calibration!r} is not one of "
                            f"{', '.join(CALIBRATIONS)}")
    if data is not None and kind == TOKEN_CLASSIFIER:
        raise QuantizeError(f"{src} is a token classifier: its report is label agreement with "
                            "the source on built-in text, and no labelled data format holds a "
                            f"label per token, so data={data!r} does not apply; leave it out")
    if data is not None and kind == ENCODER:
        raise QuantizeError(f"{src} is an encoder: its accuracy report reads queries and "
                            "passages drawn from the standard library's docstrings "
                            "(tinyt.export.retrieval_set), so data="
                            f"{data!r} (a corpus or classification directory) does not apply; "
                            "leave it out")


def quantize(src_dir: str | os.PathLike, out_dir: str | os.PathLike, *, bits: int = 8,
             block_size: int = DEFAULT_BLOCK, mode: str = "dynamic",
             exclude: list[str] | tuple[str, ...] = (), data: str | None = None,
             calibration: str = "minmax", per_channel: bool = True,
             reduce_range: bool | None = None, search: dict | None = None,
             kernel: str = "nbits", keep_8bit: list[str] | tuple[str, ...] = (),
             scheme: str | None = None, scale_search: bool | None = None) -> Built:
    """Quantize an artifact's weights and measure the accuracy change against it on held-out
    data (`data`: the corpus or classification directory; default the built-in one). Static
    mode calibrates on the training split of the same corpus; reduce_range=None takes this
    CPU's preset. keep_8bit (bits=4): modules kept at 8 bits, e.g. 'lm_head' (the tied table
    then 8-bit for both its readers: export/blockquant.py). scheme / scale_search: how a
    block's values map to levels (export/blockquant.py SCHEMES: symmetric, symmetric-full,
    asymmetric with zero points; the least-squared-error scale per block); None takes
    DEFAULT_SCHEME for the bits (4: asymmetric with the search, 8: symmetric)."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if mode == "static" or kernel != "nbits":  # no MatMulNBits blocks: nothing to choose
        default = ("symmetric", False)
    else:
        default = DEFAULT_SCHEME.get(bits, ("symmetric", False))
    scheme = default[0] if scheme is None else scheme
    scale_search = default[1] if scale_search is None else scale_search
    src = open_source(src_dir, out_dir)
    manifest = src.manifest
    proto = src.graph()
    cfg, block, kind = src.config, src.block, src.kind
    _check_request(src_dir, manifest, proto, kind, mode=mode, bits=bits, block_size=block_size,
                   kernel=kernel, calibration=calibration, keep_8bit=list(keep_8bit),
                   scheme=scheme, scale_search=scale_search, data=data)
    preset = int8_preset()
    if reduce_range is not None:
        preset = {**preset, "reduce_range": reduce_range}
    exactness = int8.quantized_entry({"kernel": kernel, "mode": mode,
                                      "reduce_range": bool(preset["reduce_range"])})
    if not int8.exact_everywhere(exactness) and saturates_here():
        raise QuantizeError(
            f"8-bit u8 x s8 weights (kernel={kernel!r}, mode={mode!r}, reduce_range=False) "
            "saturate on this CPU (x86 without VNNI / AMX adds pairs of products in 16 bits), "
            "so the accuracy check would measure wrong products: quantize on a CPU with VNNI, "
            "AMX or ARM dot products, or keep 7-bit weights here (the default; exact on every "
            "CPU)")
    # whether a row's outputs are independent of the other rows of its batch (no activation
    # scale is shared between rows): serving may then batch prompts, the accuracy check too
    independent = mode != "static" and kernel != "qgemm"
    tokenizer = Tokenizer.from_file(src_dir / "tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ONNX_FILE
        calibrated = None
        if mode == "static":
            report, calibrated = quantize_qdq(
                src_dir / ONNX_FILE, path, cfg, kind, tokenizer, calibration=calibration,
                per_channel=per_channel, reduce_range=bool(preset["reduce_range"]),
                activation_type=str(preset["activation_type"]), exclude=list(exclude),
                data=data)
        else:
            report = quantize_weights(proto, bits=bits, block=block_size,
                                      accuracy_level=MODES[mode], exclude=list(exclude),
                                      kernel=kernel,
                                      reduce_range=bool(preset["reduce_range"]),
                                      keep_8bit=list(keep_8bit), scheme=scheme,
                                      scale_search=scale_search)
            save_graph(proto, path)
        for flag, names, used in (("--exclude", exclude, report.exclusions_used),
                                  ("--keep-8bit", keep_8bit, report.keep_8bit_used)):
            unused = [e for e in names if e not in used]
            if unused:
                raise QuantizeError(f"{flag} {', '.join(unused)} names no module with weights; "
                                    f"modules: {sorted(report.modules)}")
        if not report.quantized:
            raise QuantizeError(f"nothing in {src_dir / ONNX_FILE} was quantized: "
                                f"{report.skipped}")
        check_graph(path)
        ref = graph_session(src_dir / ONNX_FILE, level="all")
        cand = graph_session(path, level="all")
        if kind in (CLASSIFIER, TOKEN_CLASSIFIER):
            accuracy = classifier_report(ref, cand, cfg, kind, tokenizer, block["labels"], data,
                                         rows_independent=independent)
        elif kind == ENCODER:
            accuracy = encoder_accuracy(ref, cand, Artifact(src_dir, cfg, kind, None, manifest),
                                        tokenizer, rows_independent=independent)
        else:
            accuracy = lm_accuracy(ref, cand, cfg, kind, tokenizer, data,
                                   rows_independent=independent)
        src_bytes, out_bytes = _bytes(src.model_path), _bytes(path)
        return write_artifact(out_dir, src, [path], stage="quantize", options={
            "mode": mode, "bits": bits, "exclude": list(exclude), "data": data,
            "kernel": kernel, **({"keep_8bit": list(keep_8bit)} if keep_8bit else {}),
            **({"reduce_range": bool(preset["reduce_range"])} if kernel != "nbits" else {}),
            **({"calibration": calibration, "per_channel": per_channel,
                "hardware_preset": preset} if mode == "static" else {"block_size": block_size}),
            **({"scheme": scheme, "scale_search": scale_search} if kernel == "nbits"
               and mode != "static" else {})},
            extra={
            "graph": kind, "opset": manifest.get("opset"), "io": manifest.get("io"),
            "quantization": {
                "quantized": report.quantized, "excluded": report.excluded,
                "skipped": report.skipped, "shared_tables": report.shared_tables,
                **({"kept_8bit": report.kept_8bit} if keep_8bit else {}),
                "contrib_domain": MS, "bytes": out_bytes,
                "bytes_of_source": src_bytes, "size_ratio": out_bytes / src_bytes,
                "rows_independent": independent,
                **({"calibration_window": check_tokens(cfg)} if mode == "static" else {}),
                **({"calibration_set": calibrated} if calibrated else {}),
            },
            "int8": {ONNX_FILE: exactness},
            "accuracy": accuracy, **({"search": search} if search else {}),
            "versions": src.versions()})


def _bytes(model: Path) -> int:
    """A model's size on disk, its external data included."""
    return sum(f.stat().st_size for f in graph_files(model))
