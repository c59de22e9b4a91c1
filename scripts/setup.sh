#!/usr/bin/env bash
# Create .venv and install tinyt with the extras given (default: cpu,export,dev,optimum,bench,triton,peers,serve,web,eval,audio,ray);
# with `peers`, also .venv-genai-builder (scripts/setup-genai-builder.sh); with `web`,
# onnxruntime-web, @huggingface/tokenizers and the system Chromium (scripts/setup-web.sh);
# with `dev`, the real models of the `real` tests (scripts/setup-real.sh).
# torch==2.13.0 goes in first: its CPU wheel lies on the project's machines, while a bare
# 'torch' requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python caches what it compiles as it imports (--no-compile below leaves that to first use): a
# shell that sets PYTHONDONTWRITEBYTECODE would have every later process compile torch's and
# transformers' sources again (docs/testing.md, "The suite's time")
unset PYTHONDONTWRITEBYTECODE
extras="${1:-cpu,export,dev,optimum,bench,triton,peers,serve,web,eval,audio,ray}"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
# --no-compile: pip byte-compiles every file it installs (torch alone: 160 s against 47 s without,
# measured on a loaded 2-core EPYC); Python compiles what it imports, once, on first use
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile)
case ",$extras," in
  *,torch,*|*,export,*|*,dev,*|*,optimum,*) "${pip[@]}" "torch==2.13.0" ;;
esac
"${pip[@]}" -e ".[${extras}]"
case ",$extras," in  # the peer benchmark's GenAI model builder needs transformers 5.x: own venv
  *,peers,*) bash scripts/setup-genai-builder.sh ;;
esac
case ",$extras," in  # the browser target: onnxruntime-web, tokenizers (npm), the system Chromium
  *,web,*) bash scripts/setup-web.sh ;;
esac
case ",$extras," in  # Debian packages of the tests (docs/testing.md): qemu-user, an emulated
  *,dev,*)          # AVX2-only CPU for the int8 tests; espeak-ng, speech for the audio tests
    missing=()
    [ "$(uname -m)" = x86_64 ] && ! command -v qemu-x86_64 >/dev/null && missing+=(qemu-user)
    command -v espeak-ng >/dev/null || missing+=(espeak-ng)
    if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        "${missing[@]}" >/dev/null || echo "setup: ${missing[*]} not installed; the tests" \
        "that need them skip, naming it" >&2
    fi ;;
esac
case ",$extras," in  # the real models of the `real` tests (scripts/setup-real.sh): ~180 MB
  *,dev,*) bash scripts/setup-real.sh ;;
esac
.venv/bin/python -c "import tinyt; print('tinyt', tinyt.__version__, 'installed in .venv')"
