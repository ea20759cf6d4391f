#!/usr/bin/env bash
# The test command: install what the tests need, then
#  1. every Rust test (unit tests, golden vectors, integration tests that mount for real;
#     as root with /dev/fuse),
#  2. the codec reference checks: build the reference ggml (tools/build_ggml_ref.sh), check
#     that the committed golden vectors are exactly what it produces, and run the randomized
#     differential test (100,000 rows per quantiser) against it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
cargo test --locked --all-targets

echo "== codec reference checks"
XPACKFS_GGML_LIB="${XPACKFS_GGML_LIB:-$(bash tools/build_ggml_ref.sh)}"
export XPACKFS_GGML_LIB
cargo build --locked --release --quiet
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 tools/ggml_ref.py golden --out "$tmp/golden" >/dev/null
cmp tests/golden/quantize.bin "$tmp/golden/quantize.bin"
cmp tests/golden/dequantize.bin "$tmp/golden/dequantize.bin"
echo "golden vectors: identical to the reference's output"
python3 tools/ggml_ref.py diff --rows "${XPACKFS_DIFF_ROWS:-100000}" --seed "${XPACKFS_DIFF_SEED:-20261130}"
