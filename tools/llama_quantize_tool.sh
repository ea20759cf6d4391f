#!/usr/bin/env bash
# Build llama.cpp's own `llama-quantize` command (tools/quantize/{main,quantize}.cpp, with
# common/{imatrix-loader,common,log,json}.cpp) from the sources vendored in the
# llama-cpp-python==0.3.36 sdist (llama.cpp 0c1e57098), linked against the libllama.so
# that tools/peers/llama_cpp_peer.sh provides, and print its path. The GGUF output view's
# `-o imatrix=` is checked against it: the command loads the imatrix file and adds the
# `quantize.imatrix.*` keys itself, which the library's llama_model_quantize does not.
# About a minute on 2 cores; cached in ~/.cache/xpackfs/llama-quantize-0.3.36.
#   bash tools/llama_quantize_tool.sh [DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/xpackfs/llama-quantize-0.3.36}"
bin="$dir/llama-quantize"
if [[ -x "$bin" ]]; then echo "$bin"; exit 0; fi
py="${PYTHON:-python3}"
peer="$(bash "$here/peers/llama_cpp_peer.sh")"
lib="$(PYTHONPATH="$peer" "$py" -c 'import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), "lib"))')"
[[ -f "$lib/libllama.so" ]] || { echo "no libllama.so in $lib" >&2; exit 1; }
ref="${XDG_CACHE_HOME:-$HOME/.cache}/xpackfs/ggml-ref"
if [[ ! -d "$ref/llama_cpp_python-0.3.36" ]]; then
  mkdir -p "$ref"
  "$py" -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    llama-cpp-python==0.3.36 -d "$ref" >&2
  tar xzf "$ref/llama_cpp_python-0.3.36.tar.gz" -C "$ref"
fi
v="$ref/llama_cpp_python-0.3.36/vendor/llama.cpp"
mkdir -p "$dir/obj"
sed -e 's/@LLAMA_BUILD_NUMBER@/0/' -e 's/@LLAMA_BUILD_COMMIT@/0c1e57098/' -e 's/@BUILD_COMPILER@/c++/' \
  -e 's/@BUILD_TARGET@/x86_64/' "$v/common/build-info.cpp.in" > "$dir/obj/build-info.cpp"
flags=(-std=c++17 -O1 -ffunction-sections -fdata-sections -I"$v/include" -I"$v/ggml/include" -I"$v/common" -I"$v/src" -I"$v/vendor")
for f in tools/quantize/main.cpp tools/quantize/quantize.cpp common/imatrix-loader.cpp common/common.cpp common/log.cpp common/json.cpp; do
  "${CXX:-c++}" "${flags[@]}" -c "$v/$f" -o "$dir/obj/$(basename "$f" .cpp).o" >&2
done
"${CXX:-c++}" "${flags[@]}" -c "$dir/obj/build-info.cpp" -o "$dir/obj/build-info.o" >&2
# --gc-sections drops the parts of common.cpp that need the rest of llama-common.
"${CXX:-c++}" -o "$bin.tmp" "$dir"/obj/*.o -Wl,--gc-sections -L"$lib" -lllama -lggml -lggml-base \
  -Wl,-rpath,"$lib" -lpthread >&2
mv "$bin.tmp" "$bin"
echo "$bin"
