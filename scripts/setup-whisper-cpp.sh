#!/usr/bin/env bash
# whisper.cpp for the Whisper peer benchmark (engines whisper.cpp-f16, whisper.cpp-f16-fa,
# whisper.cpp-q8_0): opt-in, kept out of the extras and CI. pywhispercpp publishes a manylinux
# wheel for CPython 3.8-3.13 on x86-64 (whisper.cpp 1.8.5, ggml built for AVX2, OpenMP), so
# nothing compiles for the engine itself; whisper.cpp's quantizer (whisper-quantize, for q8_0)
# is not in the wheel nor reachable through the bindings, and is compiled here from the same
# source distribution (about 6 minutes on 2 busy cores). Cached; a later run takes seconds.
#
#   bash scripts/setup-whisper-cpp.sh [CACHE]     (default CACHE: ~/.cache/tinyt/whisper-cpp)
#
# CACHE/wheels/      the pywhispercpp wheel
# CACHE/converter/   whisper.cpp's models/convert-h5-to-ggml.py, from the source distribution
# CACHE/bin/         whisper-quantize (WHISPER_CPP_QUANTIZE=0: skipped, and the q8_0 row with it)
# The benchmark finds CACHE through $TINYT_WHISPER_CPP or the default.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${1:-${TINYT_WHISPER_CPP:-${XDG_CACHE_HOME:-$HOME/.cache}/tinyt/whisper-cpp}}"
version="${PYWHISPERCPP_VERSION:-1.5.1}"
pip=(.venv/bin/python -m pip --disable-pip-version-check)
mkdir -p "$cache/wheels" "$cache/src" "$cache/converter" "$cache/bin"
ls "$cache/wheels"/pywhispercpp-"$version"-*.whl >/dev/null 2>&1 || \
  "${pip[@]}" download --quiet --no-deps --only-binary :all: "pywhispercpp==$version" \
    -d "$cache/wheels"
"${pip[@]}" install --quiet "$cache/wheels"/pywhispercpp-"$version"-*.whl
sdist="$cache/src/pywhispercpp-$version.tar.gz"
[ -f "$sdist" ] || "${pip[@]}" download --quiet --no-deps --no-binary pywhispercpp \
    "pywhispercpp==$version" -d "$cache/src"
src="pywhispercpp-$version/whisper.cpp"
if [ ! -f "$cache/converter/convert-h5-to-ggml.py" ]; then
  tar xzf "$sdist" -C "$cache/src" "$src/models/convert-h5-to-ggml.py"
  cp "$cache/src/$src/models/convert-h5-to-ggml.py" "$cache/converter/"
  rm -rf "$cache/src/pywhispercpp-$version"
fi
if [ "${WHISPER_CPP_QUANTIZE:-1}" != 0 ] && [ ! -x "$cache/bin/whisper-quantize" ]; then
  echo "building whisper.cpp's whisper-quantize from source (about 6 minutes on 2 cores)..." >&2
  tar xzf "$sdist" -C "$cache/src" "$src"
  build=$(mktemp -d)
  cmake -S "$cache/src/$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DWHISPER_BUILD_TESTS=OFF -DWHISPER_BUILD_EXAMPLES=ON \
    -DWHISPER_SDL2=OFF >/dev/null
  cmake --build "$build" --target whisper-quantize -j "$(nproc)" >/dev/null
  cp "$build/bin/whisper-quantize" "$cache/bin/"
  rm -rf "$build" "$cache/src/pywhispercpp-$version"
fi
.venv/bin/python -c "import _pywhispercpp as pw; print('pywhispercpp $version installed:', \
pw.whisper_print_system_info().strip())"
ls "$cache/converter" "$cache/bin"
