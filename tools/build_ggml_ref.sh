#!/usr/bin/env bash
# Build the reference libggml-base.so from the ggml sources vendored in the
# llama-cpp-python==0.3.36 sdist (what `pip install llama-cpp-python==0.3.36` compiles),
# building only the ggml-base target: the quantisers live there, and ggml's CMake gives
# ggml-base no -march flags (GGML_NATIVE only affects ggml-cpu), so this is the same
# x86-64 baseline code without FMA, in ~2 minutes instead of a full llama.cpp build.
#   bash tools/build_ggml_ref.sh [DIR]   (default ~/.cache/xpackfs/ggml-ref)
# Prints the path of libggml-base.so; export it as XPACKFS_GGML_LIB.
set -euo pipefail
dir="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/xpackfs/ggml-ref}"
lib="$dir/build/bin/libggml-base.so"
if [[ -f "$lib" ]]; then echo "$lib"; exit 0; fi
mkdir -p "$dir"
command -v cmake >/dev/null || python3 -m pip install -q --disable-pip-version-check "cmake>=3.21" >&2
if [[ ! -d "$dir/llama_cpp_python-0.3.36" ]]; then
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    llama-cpp-python==0.3.36 -d "$dir" >&2
  tar xzf "$dir/llama_cpp_python-0.3.36.tar.gz" -C "$dir"
fi
src="$dir/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml"
# The sdist leaves out ggml.pc.in (pkg-config template), which a standalone configure wants.
[[ -f "$src/ggml.pc.in" ]] || : > "$src/ggml.pc.in"
cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \
  -DGGML_OPENMP=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$dir/build" --target ggml-base -j "$(nproc)" >/dev/null
lib=$(find "$dir/build" -name 'libggml-base.so' | head -1)
echo "$lib"
