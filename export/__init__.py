"""tinyt.export: from a checkpoint to deployable ONNX artifacts.

    export_onnx(checkpoint_dir, out_dir, *, opset=18, with_past=True) -> Path      (torch)
    verify(checkpoint_dir, onnx_dir, *, report_path=None) -> report dict            (torch)
    tinyt.export.optimize / quantize / package / search                             (no torch)

The names below are imported when first used, so `import tinyt.export.optimize` (and
`tinyt optimize / quantize / package`) never load torch: an edge build machine or a CI job
that only derives artifacts from an ONNX file installs onnxruntime, onnx and onnxscript
(extra `onnx`), not torch.
"""
from __future__ import annotations

import importlib

_LAZY = {"export_onnx": "exporter", "ExportError": "exporter", "DEFAULT_OPSET": "exporter",
         "verify": "verifier", "VerificationError": "verifier", "reorder_bound": "compare"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
