#!/usr/bin/env bash
# Opt-in: transformers.js at the version web/transformers-js/package-lock.json pins, for the
# browser benchmark's comparison (benchmarks/browser.py --transformers-js
# web/transformers-js/node_modules). ~475 MB (it brings onnxruntime-node and sharp, whose
# install scripts are skipped: the benchmark uses only its browser bundle). Not in CI.
set -euo pipefail
cd "$(dirname "$0")/../web/transformers-js"
npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
node -p "'transformers.js ' + require('./node_modules/@huggingface/transformers/package.json').version"
