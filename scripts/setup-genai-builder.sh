#!/usr/bin/env bash
# ONNX Runtime GenAI's model builder in a venv of its own, .venv-genai-builder, for the peer
# benchmark (benchmarks/peers/: engines genai-builder-*). The builder 0.18 imports classes
# of transformers 5.x, while tinyt's `optimum` extra pins transformers < 4.58: the two cannot
# share one environment. The builder only converts; GenAI itself runs in .venv.
#   bash scripts/setup-genai-builder.sh && .venv-genai-builder/bin/python -m \
#       onnxruntime_genai.models.builder -i HF_DIR -o OUT -p int4 -e cpu
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-genai-builder}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
"${pip[@]}" "torch==2.13.0"  # the CPU wheel on this disk, not a CUDA build
"${pip[@]}" "onnxruntime-genai==0.18.0" "transformers>=5,<6" onnx onnx-ir safetensors tqdm
"$venv/bin/python" -c "import onnxruntime_genai.models.builder, transformers; \
print('GenAI model builder ready in $venv (transformers', transformers.__version__ + ')')"
