#!/usr/bin/env bash
# Benchmarks on a machine with a GPU, in under 5 minutes: PyTorch CUDA eager (with and without
# the KV cache) and every ONNX Runtime GPU variant the installed onnxruntime offers (CUDA,
# TensorRT; none with the CPU build, which the result records), writing the same JSON as the
# CPU run to benchmarks/results/gpu/. Needs the artifacts the main job writes.
#   bash benchmarks/gpu.sh [ARTIFACTS_DIR] [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
artifacts="${1:-artifacts}"
python="${2:-${PYTHON:-.venv/bin/python}}"
[ -d "$artifacts/checkpoint" ] && [ -d "$artifacts/onnx" ] || {
  echo "gpu.sh: $artifacts/checkpoint and $artifacts/onnx are needed: run the main job first" >&2
  exit 2
}
exec timeout 300 "$python" -m benchmarks.harness "$artifacts" --out benchmarks/results/gpu \
  --mode quick --device cuda
