#!/usr/bin/env bash
# The test command: install what the tests need, build the reference ggml
# (tools/build_ggml_ref.sh; the requantisation tests run the fourth seed with it), then
#  0. rustfmt (rustfmt.toml) of the crate and the fuzz crate, then clippy on every target with warnings as errors (and every unsafe block documented),
#  1. every Rust test (unit tests, golden vectors, integration tests that mount for real
#     and compare with the seeds and Python peers; as root with /dev/fuse),
#  1b. the remote-source test servers, checked with the clients they stand in for
#     (huggingface_hub for the Hub stand-in, a raw client for the fault proxy),
#  2. the codec reference checks: the committed golden vectors must be exactly what the
#     reference produces, and the randomized differential test (100,000 rows per
#     quantiser variant and per SIMD level this CPU has: scalar, avx2, avx512; about 3
#     minutes here; 20,000 rows per variant of Q3_K..Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and
#     IQ4_XS)
#     must find no mismatch.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's start, in seconds since the run began (.ci/run's start when it calls this).
export XPACKFS_RUN_START="${XPACKFS_RUN_START:-$(date +%s)}"
step() { echo "== [$(($(date +%s) - XPACKFS_RUN_START)) s] $*"; }
step "dependencies"
bash tools/deps.sh
step "reference ggml and llama.cpp peers"
XPACKFS_GGML_LIB="${XPACKFS_GGML_LIB:-$(bash tools/build_ggml_ref.sh)}"
export XPACKFS_GGML_LIB
echo "reference ggml: $XPACKFS_GGML_LIB"
# llama-cpp-python 0.3.36 (llama_model_quantize, the gguf view's peer): compiled from its sdist
# once into a cache (about 20 minutes on 2 cores, not in requirements.txt for that reason);
# tests/gguf_view.rs finds it through this same script.
XPACKFS_LLAMA_CPP="$(bash tools/peers/llama_cpp_peer.sh)"
echo "llama-cpp-python: ${XPACKFS_LLAMA_CPP:-on the Python path}"
# llama.cpp's llama-quantize command (the gguf view's imatrix= peer), built against it (a minute).
echo "llama-quantize: $(bash tools/llama_quantize_tool.sh)"
if ! cargo clippy --version >/dev/null 2>&1 && command -v rustup >/dev/null; then rustup component add clippy; fi
if ! cargo fmt --version >/dev/null 2>&1 && command -v rustup >/dev/null; then rustup component add rustfmt; fi
step "rustfmt and clippy"
cargo fmt --check
(cd fuzz && cargo fmt --check)
cargo clippy --locked --all-targets --quiet -- -D warnings -D clippy::undocumented_unsafe_blocks
step "cargo test"
cargo test --locked --all-targets

step "the remote-source test servers, checked with the clients they stand in for"
python3 tools/peers/remote/check_hub_standin.py
python3 tools/peers/remote/check_fault_proxy.py

step "codec reference checks"
cargo build --locked --release --quiet
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 tools/peers/ggml_ref.py golden --out "$tmp/golden" >/dev/null
cmp tests/golden/quantize.bin "$tmp/golden/quantize.bin"
cmp tests/golden/dequantize.bin "$tmp/golden/dequantize.bin"
cmp tests/golden/quantize_k.bin "$tmp/golden/quantize_k.bin"
cmp tests/golden/quantize_legacy.bin "$tmp/golden/quantize_legacy.bin"
cmp tests/golden/dequantize_legacy.bin "$tmp/golden/dequantize_legacy.bin"
echo "golden vectors: identical to the reference's output"
step "randomized differential test against the reference ggml"
python3 tools/peers/ggml_ref.py diff --rows "${XPACKFS_DIFF_ROWS:-100000}" --seed "${XPACKFS_DIFF_SEED:-20261130}"
# Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, each without and with an imatrix: 20,000 rows each.
python3 tools/peers/ggml_ref.py diff --rows "${XPACKFS_DIFF_ROWS_LEGACY:-20000}" --seed "${XPACKFS_DIFF_SEED:-20261130}" --types legacy
