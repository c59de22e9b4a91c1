#!/usr/bin/env bash
# Create .venv and install tinyt with the extras given (default: cpu,export,dev,optimum,bench,triton,peers,serve,web);
# with `peers`, also .venv-genai-builder (scripts/setup-genai-builder.sh); with `web`,
# onnxruntime-web and the system Chromium (scripts/setup-web.sh).
# torch==2.13.0 goes in first: its CPU wheel lies on the project's machines, while a bare
# 'torch' requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-cpu,export,dev,optimum,bench,triton,peers,serve,web}"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
case ",$extras," in
  *,torch,*|*,export,*|*,dev,*|*,optimum,*) "${pip[@]}" "torch==2.13.0" ;;
esac
"${pip[@]}" -e ".[${extras}]"
case ",$extras," in  # the peer benchmark's GenAI model builder needs transformers 5.x: own venv
  *,peers,*) bash scripts/setup-genai-builder.sh ;;
esac
case ",$extras," in  # the browser target: onnxruntime-web (npm) and the system Chromium
  *,web,*) bash scripts/setup-web.sh ;;
esac
.venv/bin/python -c "import tinyt; print('tinyt', tinyt.__version__, 'installed in .venv')"
