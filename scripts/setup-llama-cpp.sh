#!/usr/bin/env bash
# llama.cpp for the peer benchmark (engines llama.cpp-q8_0, llama.cpp-q4_0): opt-in, kept out
# of the extras and CI, because llama-cpp-python compiles llama.cpp from source (6 min on a
# 2-core Xeon with AMX, ~20 on a 2-core EPYC). Built once into a cache; a later run installs
# the cached wheel in seconds.
#
#   bash scripts/setup-llama-cpp.sh [CACHE]      (default CACHE: ~/.cache/tinyt/llama-cpp)
#
# CACHE/wheels/        the llama-cpp-python wheel built here (libllama for this CPU)
# CACHE/converter/     llama.cpp's own convert_hf_to_gguf.py, conversion/ and gguf-py, from
#                      the same source distribution (the version the wheel's libllama reads)
# The benchmark finds the converter through $TINYT_LLAMA_CPP_CONVERTER or CACHE/converter.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/tinyt/llama-cpp}"
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
pip=(.venv/bin/python -m pip --disable-pip-version-check)
mkdir -p "$cache/wheels" "$cache/src"
sdist="$cache/src/llama_cpp_python-$version.tar.gz"
# --no-binary for this one package only: with :all: pip also builds each of its build
# requirements (scikit-build-core, cmake, ...) from source to read its metadata
[ -f "$sdist" ] || "${pip[@]}" download --quiet --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$version" -d "$cache/src"
if ! ls "$cache/wheels"/llama_cpp_python-"$version"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $version from source (about 20 minutes on 2 cores)..." >&2
  # no multimodal library (LLAVA_BUILD: mtmd), which nothing here loads
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" \
    "${pip[@]}" wheel --quiet --no-deps "$sdist" -w "$cache/wheels"
fi
"${pip[@]}" install --quiet "$cache/wheels"/llama_cpp_python-"$version"-*.whl
if [ ! -d "$cache/converter/conversion" ]; then  # the script, its model classes, gguf-py
  tmp=$(mktemp -d)
  src="llama_cpp_python-$version/vendor/llama.cpp"
  tar xzf "$sdist" -C "$tmp" "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py"
  rm -rf "$cache/converter" && mkdir -p "$cache/converter"
  cp -r "$tmp/$src/"{convert_hf_to_gguf.py,conversion,gguf-py} "$cache/converter/"
  rm -rf "$tmp"
fi
"${pip[@]}" install --quiet sentencepiece  # the converter imports it for Llama vocabularies
.venv/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, \
'installed; converter in $cache/converter')"
