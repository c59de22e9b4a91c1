"""tinyt.runtime: torch-free ONNX Runtime sessions, generation with a KV cache, classification.

Not built yet (issue 5). Imports nothing but the standard library, so it stays torch-free.
"""
