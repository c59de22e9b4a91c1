#!/usr/bin/env bash
# The encoder peer benchmark's engines in a venv of their own, .venv-encoder-peers
# (benchmarks/peers/encoders.py runs each peer's worker with its python when it exists):
# sentence-transformers (torch and its ONNX backend), fastembed and Optimum's ONNX Runtime
# models. Kept out of .venv: sentence-transformers 6.x wants transformers 5.x, which tinyt's
# `optimum` extra (optimum-onnx pins transformers < 4.58) cannot share, and fastembed brings
# its own onnxruntime pin. The pins are what pip resolved together (sentence-transformers 5.7.0
# is the newest whose ONNX backend installs beside optimum-onnx 0.1.0); onnxruntime is .venv's
# own version, so the ONNX engines run the same library.
#   bash scripts/setup-encoder-peers.sh && .venv/bin/python -m benchmarks.peers.encoders --rounds 10
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-encoder-peers}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
"${pip[@]}" "torch==2.13.0"  # the CPU wheel on this disk, not a CUDA build
"${pip[@]}" "sentence-transformers[onnx]==5.7.0" "fastembed==0.9.1" \
    "optimum[onnxruntime]==2.1.0" "optimum-onnx==0.1.0" "transformers==4.57.6" \
    "onnxruntime==1.32.0"
"$venv/bin/python" -c "import sentence_transformers, fastembed, optimum.onnxruntime, \
onnxruntime; print('encoder peers ready in $venv: sentence-transformers', \
sentence_transformers.__version__, '/ fastembed', fastembed.__version__, '/ onnxruntime', \
onnxruntime.__version__)"
