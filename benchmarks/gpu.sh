#!/usr/bin/env bash
# Benchmarks on a machine with a GPU, in under 5 minutes: PyTorch CUDA eager (with and without
# the KV cache) and every ONNX Runtime GPU variant the installed onnxruntime offers (CUDA,
# TensorRT; none with the CPU build, which the result records), writing the same JSON as the
# CPU run to OUT (default benchmarks/results/gpu/). Needs the artifacts the main job writes.
#   bash benchmarks/gpu.sh [ARTIFACTS_DIR] [PYTHON] [OUT]
set -euo pipefail
artifacts="${1:-artifacts}"
python="${2:-${PYTHON:-.venv/bin/python}}"
out="${3:-$(dirname "$0")/results/gpu}"
[ -d "$artifacts/checkpoint" ] && [ -d "$artifacts/onnx" ] || {
  echo "gpu.sh: $artifacts/checkpoint and $artifacts/onnx are needed: run the main job first" >&2
  exit 2
}
exec timeout 300 "$python" -m tinyt.benchmarks.harness "$artifacts" --out "$out" \
  --mode quick --device cuda
