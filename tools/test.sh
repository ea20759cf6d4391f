#!/usr/bin/env bash
# The test command: install what the tests need, then run every test (unit tests and
# integration tests that mount for real; run as root with /dev/fuse).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
cargo test --locked --all-targets
