#!/usr/bin/env bash
# The deployment chain at a preset's size: each stage's wall time and peak memory (GNU time's
# maximum resident set size), one stage at a time on an otherwise idle machine.
#
#   bash lab/chain_at_size.sh PRESET WORK_DIR RESULTS_DIR [CORPUS]
#   bash lab/chain_at_size.sh hf:SHAPE WORK_DIR RESULTS_DIR [CORPUS]
#
# hf:SHAPE (qwen3-0.6b, llama-3.2-1b: benchmarks/hf_shape.py) starts from a random-weight
# Hugging Face directory at a real model's shape, context and rope settings, imported with
# `tinyt import-hf` (whole context), instead of one training step.
#
# README runs it on the gpt2-small preset (12 layers, 12 heads, width 768, context 1024,
# vocabulary as far as a BPE trained on the corpus reaches toward 50257) after one training
# step: briefly trained weights, real sizes. Writes RESULTS_DIR/chain.md with the commands
# beside the figures, and chain.log with their output. Paths are relative to where it runs;
# tinyt and python come from PATH (an activated environment), else from .venv/bin.
set -euo pipefail
PRESET=${1:?preset}
WORK=${2:?work directory}
RESULTS=${3:?results directory}
DATA=(${4:+--data "$4"})
TINYT=$(command -v tinyt || echo .venv/bin/tinyt)
PY="$(dirname "$TINYT")/python"
mkdir -p "$RESULTS"
OUT="$RESULTS/chain.md"
LOG="$RESULTS/chain.log"
: > "$LOG"
trap 'echo "a stage failed; the end of $LOG:" >&2; tail -5 "$LOG" >&2' ERR

{
  if [[ $PRESET == hf:* ]]; then
    echo "# The chain at the ${PRESET#hf:} shape (a random-weight Hugging Face directory)"
  else
    echo "# The chain at the $PRESET preset's size"
  fi
  echo
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores;" \
       "flags: $(grep -m1 -o -w -E 'avx512_vnni|avx_vnni|amx_int8|avx2' /proc/cpuinfo | sort -u | xargs)"
  echo "tinyt $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?'), $("$PY" -c 'import torch, onnxruntime; print("torch", torch.__version__, "onnxruntime", onnxruntime.__version__)')"
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
if [[ $PRESET == hf:* ]]; then
  stage hf-shape "$PY" -m tinyt.benchmarks.hf_shape "${PRESET#hf:}" "$WORK/hf"
  stage import-hf "$TINYT" import-hf "$WORK/hf" "$WORK/checkpoint"
else
  stage train "$TINYT" train --preset "$PRESET" --max-steps 1 --batch-size 1 --eval-interval 1 \
    --out "$WORK/checkpoint" "${DATA[@]}"
fi
stage export "$TINYT" export "$WORK/checkpoint" "$WORK/onnx"
stage verify "$TINYT" verify "$WORK/checkpoint" "$WORK/onnx"
stage optimize "$TINYT" optimize "$WORK/onnx" "$WORK/onnx-opt"
stage quantize "$TINYT" quantize "$WORK/onnx-opt" "$WORK/onnx-int8" "${DATA[@]}"
stage package "$TINYT" package "$WORK/onnx-int8" "$WORK/edge"
stage gqa "$TINYT" optimize "$WORK/onnx-int8" "$WORK/onnx-int8-gqa" --target gqa
stage generate "$TINYT" generate "$WORK/onnx-int8-gqa" "def fibonacci(n):" --max-new-tokens 64 \
  --temperature 0
rm -f "$RESULTS/.time"
{
  echo
  echo "Sizes: fp32 $(du -b "$WORK/onnx/model.onnx" | cut -f1) bytes," \
       "INT8 $(du -b "$WORK/onnx-int8/model.onnx" | cut -f1) bytes" \
       "($("$PY" -c "import json; q = json.load(open('$WORK/onnx-int8/manifest.json'))['quantization']; print(f\"{q['size_ratio']:.1%}\")") of the optimized fp32 graph)."
  echo "Model: $("$PY" -c "import json; m = json.load(open('$WORK/checkpoint/config.json'))['model']; print(m)")"
} >> "$OUT"
cat "$OUT"
