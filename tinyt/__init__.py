"""tinyt: a small Transformer from PyTorch training to verified ONNX Runtime inference.

This package imports without torch: the config, tokenizer and ONNX-contract modules and
`tinyt.runtime` are what an edge install (numpy + onnxruntime) uses. Torch is imported only
by the model, training and checkpoint modules, and by `tinyt.export`.
"""

__version__ = "0.1.0"
