#!/usr/bin/env bash
# The main job: install xpackfs, mount the bundled sample checkpoint with
# `mount -t fuse.xpackfs`, and show what appears. Run as root from the repository.
#   bash tools/run.sh [SOURCE.gguf] [MOUNTPOINT]
set -euo pipefail
cd "$(dirname "$0")/.."
source_file="${1:-samples/sample-moe.gguf}"
mountpoint="${2:-/mnt/xpackfs-sample}"
bash tools/deps.sh
cargo install --locked --quiet --path . --root /usr/local
mkdir -p "$mountpoint"
if mountpoint -q "$mountpoint"; then umount "$mountpoint"; fi
mount -t fuse.xpackfs "$(realpath "$source_file")" "$mountpoint" -o top_k=2
echo "== mounted: $(grep " $mountpoint " /proc/mounts)"
ls -la "$mountpoint"
echo "== xpackfs inspect $mountpoint/*.pack (first entry)"
/usr/local/bin/xpackfs inspect "$mountpoint"/*.pack --limit 1
echo "== unmount with: umount $mountpoint"
