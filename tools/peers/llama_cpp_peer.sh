#!/usr/bin/env bash
# Make llama-cpp-python==0.3.36 importable for the GGUF output view's tests and print the
# directory to put on PYTHONPATH ($XPACKFS_LLAMA_CPP), or nothing when the interpreter
# already has it. Building it compiles llama.cpp from the sdist (about 18 minutes on 2
# cores), so it is built once into a cache: ~/.cache/xpackfs/llama-cpp-python-0.3.36.
#   bash tools/peers/llama_cpp_peer.sh [DIR]
set -euo pipefail
py="${PYTHON:-python3}"
if "$py" -c 'import llama_cpp, sys; sys.exit(llama_cpp.__version__ != "0.3.36")' 2>/dev/null; then
  exit 0
fi
dir="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/xpackfs/llama-cpp-python-0.3.36}"
if ! PYTHONPATH="$dir" "$py" -c 'import llama_cpp, sys; sys.exit(llama_cpp.__version__ != "0.3.36")' 2>/dev/null; then
  mkdir -p "$dir"
  CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF}" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    "$py" -m pip install -q --disable-pip-version-check --target "$dir" llama-cpp-python==0.3.36 >&2
fi
echo "$dir"
