#!/usr/bin/env bash
# The main job: install xpackfs, mount the bundled sample checkpoint with
# `mount -t fuse.xpackfs`, and show what appears. Run as root from the repository.
#   bash tools/run.sh [SOURCE.gguf] [MOUNTPOINT]
# It works whatever was installed before (an xpackfs that cargo did not install, one built
# from another checkout, a dangling link) and when run again (a previous mount of the
# mountpoint, live or with its daemon gone, is unmounted first).
set -euo pipefail
cd "$(dirname "$0")/.."
source_file="${1:-samples/sample-moe.gguf}"
mountpoint="$(realpath -m "${2:-/mnt/xpackfs-sample}")"
bin=/usr/local/bin/xpackfs
bash tools/deps.sh
if [ -d "$bin" ] && [ ! -L "$bin" ]; then
  echo "run.sh: $bin is a directory; remove it and run again" >&2
  exit 1
fi
# --force: replace whatever binary is there, tracked by cargo or not.
cargo install --locked --quiet --force --path . --root /usr/local
# mount.fuse3 runs the first xpackfs on the default path: say so if that is not this one.
found=$(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin command -v xpackfs || true)
if [ "$(realpath -m "$found")" != "$(realpath -m "$bin")" ]; then
  echo "run.sh: warning: mount -t fuse.xpackfs will run $found, not $bin" >&2
fi
mounted() { awk -v m="$1" '$2 == m { found = 1 } END { exit !found }' /proc/mounts; }
if mounted "$mountpoint"; then
  umount "$mountpoint" 2>/dev/null || umount -l "$mountpoint"
fi
mkdir -p "$mountpoint"
mount -t fuse.xpackfs "$(realpath "$source_file")" "$mountpoint" -o top_k=2
echo "== mounted: $(grep " $mountpoint " /proc/mounts)"
ls -la "$mountpoint"
echo "== xpackfs inspect $mountpoint/*.pack (first entry)"
"$bin" inspect "$mountpoint"/*.pack --limit 1
echo "== unmount with: umount $mountpoint"
