#!/usr/bin/env bash
# guidellm (PyPI), the load generator benchmarks/guidellm_sweep.py runs against `tinyt serve`,
# in a venv of its own, .venv-guidellm: opt-in, kept out of .venv and CI. guidellm requires
# torch and transformers (5.x) for its data pipeline; a bare `pip install guidellm` resolves
# torch to a multi-GB CUDA build, so the CPU wheel of torch 2.13.0 (on this disk's package
# index) goes in first and satisfies it. guidellm 0.8.1 is the version the sweep was written
# against (its `run` takes kind=...,key=value options); transformers is the version it was
# tested with (its AutoTokenizer reads a tinyt artifact directory's tokenizer.json).
#
#   bash scripts/setup-guidellm.sh [VENV]          (default VENV: .venv-guidellm)
#   .venv/bin/python -m benchmarks.guidellm_sweep ARTIFACT --out OUT
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-guidellm}"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile)
"${pip[@]}" "torch==2.13.0"  # the CPU wheel on this disk, not a CUDA build
"${pip[@]}" "guidellm==0.8.1" "transformers==5.25.0" "torch==2.13.0"
"$venv/bin/guidellm" --version
"$venv/bin/python" -c "import torch, transformers; print('in $venv: torch', torch.__version__, \
'/ transformers', transformers.__version__)"
du -sh "$venv"
