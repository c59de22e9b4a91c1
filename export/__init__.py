"""tinyt.export: ONNX export and verification against PyTorch (optimization and quantization
follow in issue 4).

    export_onnx(checkpoint_dir, out_dir, *, opset=18, with_past=True) -> Path
    verify(checkpoint_dir, onnx_dir, *, report_path=None) -> report dict
"""
from .exporter import DEFAULT_OPSET, ExportError, export_onnx
from .verify import FP32_KV_ATOL, FP32_LOGITS_ATOL, VerificationError, verify

__all__ = ["export_onnx", "verify", "ExportError", "VerificationError", "DEFAULT_OPSET",
           "FP32_LOGITS_ATOL", "FP32_KV_ATOL"]
