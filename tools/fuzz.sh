#!/usr/bin/env bash
# Run every fuzz target (cargo-fuzz / libFuzzer) for a bounded time, seeded with the
# project's own fixtures. The machine has a stable toolchain only: RUSTC_BOOTSTRAP=1 lets
# cargo-fuzz use the sanitizer flags it needs.
#   bash tools/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-${FUZZ_SECONDS:-30}}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --quiet
export RUSTC_BOOTSTRAP=1
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
mkdir -p "$corpus"/{gguf,safetensors,int8_manifest,imatrix,work}
cp samples/sample-moe.gguf "$corpus/gguf/"
python3 tools/make_bad_gguf.py "$corpus/work/bad" >/dev/null
cp "$corpus"/work/bad/*.gguf "$corpus/gguf/"
python3 tools/make_v4_fixture.py "$corpus/work/v4" --layers 1 --experts 2
cp "$corpus"/work/v4/*.safetensors "$corpus/safetensors/"
python3 tools/imatrix_tool.py make "$corpus/work/v4" "$corpus/imatrix/a.gguf" --legacy "$corpus/imatrix/a.dat"
target/release/xpackfs materialize samples/sample-moe.gguf --out "$corpus/work/int8" --margin-gib 0 \
  -o view=kt-int8,digest_store=none >/dev/null 2>&1 || cargo run --release --quiet -- materialize samples/sample-moe.gguf \
  --out "$corpus/work/int8" --margin-gib 0 -o view=kt-int8,digest_store=none >/dev/null 2>&1
cp "$corpus/work/int8/kt-weight-manifest.json" "$corpus/int8_manifest/"
for target in gguf safetensors int8_manifest imatrix; do
  echo "== fuzz $target for ${seconds}s"
  cargo fuzz run --fuzz-dir fuzz "$target" "$corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=4096 2>&1 | tail -n 3
done
echo "fuzzing: no crash in $(( 4 * seconds ))s over 4 targets"
