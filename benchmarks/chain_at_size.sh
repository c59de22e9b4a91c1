#!/usr/bin/env bash
# The deployment chain at GPT-2 small's size: each stage's wall time and peak memory
# (GNU time's maximum resident set size), one stage at a time on an otherwise idle machine.
#
#   bash benchmarks/chain_at_size.sh [WORK_DIR] [RESULTS_DIR]
#
# The model is the gpt2-small preset (12 layers, 12 heads, width 768, context 1024, vocabulary
# as far as a BPE trained on the built-in corpus reaches toward 50257) after one training step:
# briefly trained weights, real sizes. Writes RESULTS_DIR/chain.md (default
# benchmarks/results/chain-gpt2-small) with the commands beside the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-artifacts-gpt2-small}
RESULTS=${2:-benchmarks/results/chain-gpt2-small}
TINYT=.venv/bin/tinyt
mkdir -p "$RESULTS"
OUT="$RESULTS/chain.md"
LOG="$RESULTS/chain.log"
: > "$LOG"

{
  echo "# The chain at GPT-2 small's size"
  echo
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores;" \
       "flags: $(grep -m1 -o -w -E 'avx512_vnni|avx_vnni|amx_int8|avx2' /proc/cpuinfo | sort -u | xargs)"
  echo "tinyt $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(.venv/bin/python -c 'import torch, onnxruntime; print("torch", torch.__version__, "onnxruntime", onnxruntime.__version__)')"
  echo
  echo "| stage | command | wall s | peak MiB |"
  echo "|---|---|---|---|"
} > "$OUT"

stage() {  # stage NAME COMMAND...
  local name=$1
  shift
  local t0 t1 rss
  echo "== $name: $*" >> "$LOG"
  /usr/bin/time -f "%e %M" -o "$RESULTS/.time" "$@" >> "$LOG" 2>&1
  read -r t1 rss < "$RESULTS/.time"
  echo "| $name | \`$*\` | $t1 | $((rss / 1024)) |" >> "$OUT"
  echo "$name: ${t1} s, $((rss / 1024)) MiB"
}

rm -rf "$WORK"
stage train "$TINYT" train --preset gpt2-small --max-steps 1 --batch-size 1 --eval-interval 1 \
  --out "$WORK/checkpoint"
stage export "$TINYT" export "$WORK/checkpoint" "$WORK/onnx"
stage verify "$TINYT" verify "$WORK/checkpoint" "$WORK/onnx"
stage optimize "$TINYT" optimize "$WORK/onnx" "$WORK/onnx-opt"
stage quantize "$TINYT" quantize "$WORK/onnx-opt" "$WORK/onnx-int8"
stage package "$TINYT" package "$WORK/onnx-int8" "$WORK/edge"
stage gqa "$TINYT" optimize "$WORK/onnx-int8" "$WORK/onnx-int8-gqa" --target gqa
stage generate "$TINYT" generate "$WORK/onnx-int8-gqa" "def fibonacci(n):" --max-new-tokens 64 \
  --temperature 0
rm -f "$RESULTS/.time"
{
  echo
  echo "Sizes: fp32 $(du -b "$WORK/onnx/model.onnx" | cut -f1) bytes," \
       "INT8 $(du -b "$WORK/onnx-int8/model.onnx" | cut -f1) bytes" \
       "($(.venv/bin/python -c "import json; q = json.load(open('$WORK/onnx-int8/manifest.json'))['quantization']; print(f\"{q['size_ratio']:.1%}\")") of the optimized fp32 graph)."
  echo "Model: $(.venv/bin/python -c "import json; m = json.load(open('$WORK/checkpoint/config.json'))['model']; print(m)")"
} >> "$OUT"
cat "$OUT"
