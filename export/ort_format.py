"""The ORT format's files (ONNX Runtime's mobile format), for `tinyt package --format ort`
(package.py, seq2seq_package.py): a graph saved as .ort after ONNX Runtime's optimizations at
a level, and the operator list a reduced ONNX Runtime build needs for one or more of them."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import onnxruntime as ort

from tinyt.runtime.session import ort_options

ORT_FILE = "model.ort"
OPERATORS_FILE = "required_operators.config"


def to_ort(onnx_path: Path, out: Path, level: str) -> None:
    """model.ort (optimized at `level`, saved in ORT format) and the operator list a reduced
    ONNX Runtime build needs for it."""
    from onnxruntime.tools.ort_format_model import create_config_from_models

    opts = ort_options(level=level, optimized_model=out / ORT_FILE)
    opts.add_session_config_entry("session.save_model_format", "ORT")
    # Constant folding would store a second copy of a shared table (the tied INT8 matrix's
    # Reshape for GatherBlockQuantized: +0.26 MB on the demo); the graphs come folded already.
    ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"],
                         disabled_optimizers=["ConstantFolding"])
    root = logging.getLogger("ort_format_model.utils")
    level_before, root.level = root.level, logging.WARNING  # it logs the file at INFO
    try:
        create_config_from_models([out / ORT_FILE], out / OPERATORS_FILE,
                                  enable_type_reduction=False)
    finally:
        root.setLevel(level_before)
    text = (out / OPERATORS_FILE).read_text()  # name the model, not the temporary directory
    (out / OPERATORS_FILE).write_text(re.sub(r"(?m)^# - .*$", f"# - {ORT_FILE}", text))


def write_operators(out: Path, ort_files: list[str]) -> None:
    """required_operators.config of several .ort files in `out`: the operators a reduced ONNX
    Runtime build needs to run them all, naming the files (not the temporary directory)."""
    from onnxruntime.tools.ort_format_model import create_config_from_models

    root = logging.getLogger("ort_format_model.utils")
    level_before, root.level = root.level, logging.WARNING  # it logs the file at INFO
    try:
        create_config_from_models([out / f for f in ort_files], out / OPERATORS_FILE,
                                  enable_type_reduction=False)
    finally:
        root.setLevel(level_before)
    text = (out / OPERATORS_FILE).read_text()
    (out / OPERATORS_FILE).write_text(re.sub(r"(?m)^# - .*\n?", "", text).replace(
        "# Generated from model/s:\n", "# Generated from model/s: " + ", ".join(ort_files)
        + "\n"))
