"""Static INT8: QuantizeLinear / DequantizeLinear pairs with activation ranges calibrated on the
training corpus (ONNX Runtime's quantize_static). Standard ONNX ops only; ONNX Runtime fuses
the pairs into integer kernels when it loads the model.

Only weight matmuls and embedding gathers are quantized; attention's activation x activation
matmuls stay float. The tied matrix becomes one int8 initializer and one DequantizeLinear
that feeds both the embedding Gather and the lm_head.
"""
from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

from tinyt import data as D
from tinyt.config import ModelConfig
from tinyt.errors import DataError
from tinyt.graphio import graph_files
from tinyt.runtime.feeds import check_tokens, prefill_feeds
from tinyt.tokenizer import Tokenizer

from .blockquant import QuantReport, excluded_by, module_of

CALIBRATIONS = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                "percentile": CalibrationMethod.Percentile}
CALIBRATION_WINDOWS = 32
CALIBRATION_BATCH = 4
_TYPES = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}


class _Windows(CalibrationDataReader):
    """Full-length windows of training text, fed as prefill (past length 0)."""

    def __init__(self, windows: np.ndarray, cfg: ModelConfig, kind: str):
        self.batches = iter(range(0, len(windows), CALIBRATION_BATCH))
        self.windows, self.cfg, self.kind = windows, cfg, kind

    def get_next(self):
        i = next(self.batches, None)
        if i is None:
            return None
        return prefill_feeds(self.cfg, self.kind, self.windows[i:i + CALIBRATION_BATCH])


def calibration_windows(tokenizer: Tokenizer, cfg: ModelConfig, data: str | None,
                        count: int = CALIBRATION_WINDOWS) -> np.ndarray:
    """Windows of check_tokens(cfg) tokens (the block of the presets and GPT-2, at most 128 for
    computed positions, whatever the context) from the corpus' training split (never
    validation)."""
    corpus = D.load_corpus(data)
    tokens = D.encode_documents(tokenizer, corpus.train[:200])
    W = check_tokens(cfg)
    try:
        D.check_lm_tokens(tokens, W, "calibration")
    except DataError as e:
        raise DataError(f"calibration set from {corpus.source}: {e}") from None
    return D.lm_eval_windows(tokens, W, count)[0]


def weight_nodes(proto: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str]]:
    """(node, weight initializer) for every MatMul / Gather that reads a 2-D weight, directly
    or through a Transpose (the tied lm_head)."""
    inits = {i.name for i in proto.graph.initializer}
    transposed = {n.output[0]: n.input[0] for n in proto.graph.node
                  if n.op_type == "Transpose" and n.input[0] in inits}
    out = []
    for n in proto.graph.node:
        if n.op_type == "MatMul":
            w = transposed.get(n.input[1], n.input[1])
        elif n.op_type == "Gather":
            w = n.input[0]
        else:
            continue
        if w in inits:
            out.append((n, w))
    return out


def quantize_qdq(src: Path, dst: Path, cfg: ModelConfig, kind: str, tokenizer: Tokenizer, *,
                 calibration: str, per_channel: bool, reduce_range: bool, activation_type: str,
                 exclude: list[str], data: str | None) -> QuantReport:
    proto = onnx.load(str(src))
    report = QuantReport()
    wanted = []
    for node, weight in weight_nodes(proto):
        module = module_of(node, weight)
        report.modules.add(module)
        why = excluded_by(module, exclude)
        if why:
            report.excluded.append(f"{module} ({node.op_type}, by '{why}')")
            report.exclusions_used.add(why)
        else:
            wanted.append(node.name)
            report.quantized.append(f"{module} ({node.op_type})")
    skip = [n.name for n in proto.graph.node
            if n.op_type in ("MatMul", "Gather") and n.name not in wanted]
    reader = _Windows(calibration_windows(tokenizer, cfg, data), cfg, kind)
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR  # its advice to pre-process: see README
    with contextlib.redirect_stdout(io.StringIO()):  # the percentile calibrator prints
        quantize_static(
            str(src), str(dst), reader, quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul", "Gather"], nodes_to_exclude=skip,
            per_channel=per_channel, reduce_range=reduce_range,
            activation_type=_TYPES[activation_type], weight_type=QuantType.QInt8,
            calibrate_method=CALIBRATIONS[calibration],
            use_external_data_format=len(graph_files(src)) > 1,
        )
    root.setLevel(level)
    q = onnx.load(str(dst))
    dq_users: dict[str, int] = {}
    for n in q.graph.node:
        for name in n.input:
            dq_users[name] = dq_users.get(name, 0) + 1
    report.shared_tables = sorted(
        n.input[0] for n in q.graph.node
        if n.op_type == "DequantizeLinear" and dq_users.get(n.output[0], 0) > 1
        and n.input[0].endswith("_quantized"))
    return report
