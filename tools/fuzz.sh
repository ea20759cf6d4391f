#!/usr/bin/env bash
# Run every fuzz target (cargo-fuzz / libFuzzer) for a bounded time, seeded with the
# project's own fixtures. The machine has a stable toolchain only: RUSTC_BOOTSTRAP=1 lets
# cargo-fuzz use the sanitizer flags it needs.
#   bash tools/fuzz.sh [SECONDS_PER_TARGET [TARGET...]]   (default 30 s, every target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-${FUZZ_SECONDS:-30}}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --quiet
export RUSTC_BOOTSTRAP=1
# The sanitized build without shared generics: with them, the crate's hot generic code (Vec
# zero-fills, precondition checks) ran as if from a dependency's copy, one built at opt-level 0
# (fuzz/Cargo.toml) or without the crate's inlining. The same 4,000 gguf inputs took 4.3 s
# without sharing, 12.4 s with it. Only for `cargo fuzz` (not the release build used below).
fuzz_rustflags="${RUSTFLAGS:-} -Zshare-generics=n"
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
targets=(gguf safetensors safetensors_dir int8_manifest imatrix json_caps build_gguf build_safetensors)
corpora=("${targets[@]}")
if [ $# -gt 1 ]; then shift; targets=("$@"); fi
mkdir -p "$corpus"/work; for t in "${corpora[@]}"; do mkdir -p "$corpus/$t"; done
# Seeds: the fixtures and the hostile corpora (regular files under 1 MiB: libFuzzer's input
# size follows its largest seed).
seed() { find "$1" -maxdepth 1 -type f -size -1024k -name "$2" -exec cp {} "$corpus/$3/" \; ; }
cp samples/sample-moe.gguf "$corpus/gguf/"
python3 tools/corpus/make_bad_gguf.py "$corpus/work/bad" >/dev/null
seed "$corpus/work/bad" '*.gguf' gguf
cp "$corpus"/gguf/* "$corpus/build_gguf/"
python3 tools/fixtures/make_v4_fixture.py "$corpus/work/v4" --layers 1 --experts 2
cp "$corpus"/work/v4/*.safetensors "$corpus/safetensors/"
python3 tools/corpus/make_bad_safetensors.py "$corpus/work/st" >/dev/null
seed "$corpus/work/st/hdr" '*.safetensors' safetensors
python3 tools/imatrix_tool.py make "$corpus/work/v4" "$corpus/imatrix/a.gguf" --legacy "$corpus/imatrix/a.dat"
python3 tools/corpus/make_bad_imatrix.py "$corpus/work/im" >/dev/null
seed "$corpus/work/im" '*.gguf' imatrix
seed "$corpus/work/im" '*.dat' imatrix
python3 tools/corpus/make_bad_int8.py "$corpus/work/int8bad" >/dev/null
for m in "$corpus"/work/int8bad/*/kt-*-manifest.json; do
  if [ -f "$m" ] && [ ! -L "$m" ] && [ "$(stat -c %s "$m")" -lt 1048576 ]; then
    cp "$m" "$corpus/int8_manifest/$(basename "$(dirname "$m")").json"
  fi
done
cp "$corpus"/work/v4/config.json "$corpus/json_caps/config.json"
cp "$corpus"/work/v4/model.safetensors.index.json "$corpus/json_caps/index.json"
cp "$corpus"/int8_manifest/*.json "$corpus/json_caps/"
# A directory checkpoint as one input: index, marker, config, marker, shard.
python3 - "$corpus/safetensors_dir/hf" <<'PY'
import json, sys
sys.path.insert(0, "tools/corpus")
from corpus_util import st_bytes
from make_bad_safetensors import hf_tensors
ts = hf_tensors(L=1, E=2, H=64, I=64)
index = json.dumps({"weight_map": {t[0]: "model-00001-of-00001.safetensors" for t in ts}}).encode()
mark = b"\xff\xfe\xfd\xfc"
open(sys.argv[1], "wb").write(index + mark + b'{"model_type": "toy_moe"}' + mark + st_bytes(ts, metadata={"format": "pt"}))
PY
target/release/xpackfs materialize samples/sample-moe.gguf --out "$corpus/work/int8" --margin-gib 0 \
  -o view=kt-int8,digest_store=none >/dev/null 2>&1 || cargo run --release --quiet -- materialize samples/sample-moe.gguf \
  --out "$corpus/work/int8" --margin-gib 0 -o view=kt-int8,digest_store=none >/dev/null 2>&1
cp "$corpus/work/int8/kt-weight-manifest.json" "$corpus/int8_manifest/"
# The view builders' checkpoint directories: the V4 fixture, the HF one above and every
# hostile safetensors directory, each packed into one input.
cp "$corpus/safetensors_dir/hf" "$corpus/build_safetensors/"
python3 tools/corpus/fuzz_pack_dir.py "$corpus/build_safetensors" "$corpus/work/v4" "$corpus"/work/st/dir/* >/dev/null
cp "$corpus"/build_safetensors/* "$corpus/safetensors_dir/"
for target in "${targets[@]}"; do
  echo "== [$(($(date +%s) - ${XPACKFS_RUN_START:-$(date +%s)})) s] fuzz $target for ${seconds}s"
  log="$corpus/work/fuzz-$target.log"
  if ! RUSTFLAGS="$fuzz_rustflags" cargo fuzz run --fuzz-dir fuzz "$target" "$corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=4096 >"$log" 2>&1; then
    grep -E "panicked at|^(thread|attempt|called)|ERROR: libFuzzer|SUMMARY|Test unit written" "$log" | head -n 20
    echo "fuzz $target failed (the input is under fuzz/artifacts/$target/)" >&2
    exit 1
  fi
  grep -E "^#[0-9]+.*DONE|^Done [0-9]+ runs" "$log" | tail -n 2
done
echo "fuzzing: no crash in $(( ${#targets[@]} * seconds ))s over ${#targets[@]} targets"
