"""tinyt.export: ONNX export, graph optimization, quantization and verification.

Not built yet (issues 3 and 4). This package exists so the distribution's layout is final.
"""
