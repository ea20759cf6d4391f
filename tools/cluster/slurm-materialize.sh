#!/usr/bin/env bash
# Materialize a view on a Slurm cluster: one job hashes the source, an array job of N tasks
# writes the parts, one job finalizes; each waits for the one before (afterok).
#
#   XPACKFS_SOURCE=/shared/DeepSeek-V4-Flash.gguf XPACKFS_OUT=/shared/pack \
#   XPACKFS_PARTS=16 XPACKFS_OPTIONS=top_k=6 tools/cluster/slurm-materialize.sh [sbatch options...]
#
# Every node needs xpackfs on PATH (or XPACKFS_BIN) and the shared filesystem mounted at the
# same path. Extra arguments go to every sbatch call (--partition=..., --account=...).
# Failed or preempted tasks can be resubmitted as they are (`--requeue` is set): a part
# continues from its last finished piece. SBATCH defaults below are a starting point.
set -euo pipefail

: "${XPACKFS_SOURCE:?set XPACKFS_SOURCE}" "${XPACKFS_OUT:?set XPACKFS_OUT}" "${XPACKFS_PARTS:?set XPACKFS_PARTS}"
step="$(cd "$(dirname "$0")" && pwd)/xpackfs-step.sh"
export XPACKFS_SOURCE XPACKFS_OUT XPACKFS_PARTS XPACKFS_OPTIONS XPACKFS_PIECE_SIZE XPACKFS_DIGEST_STORE XPACKFS_BIN
sb=(sbatch --parsable --export=ALL --requeue "$@")

digest=$("${sb[@]}" --job-name=xpackfs-digest --cpus-per-task=2 --time=4:00:00 --wrap "$step digest")
parts=$("${sb[@]}" --job-name=xpackfs-part --dependency="afterok:$digest" --array="0-$((XPACKFS_PARTS - 1))" \
    --cpus-per-task=8 --time=12:00:00 --wrap "$step part")
final=$("${sb[@]}" --job-name=xpackfs-finalize --dependency="afterok:$parts" --cpus-per-task=2 --time=4:00:00 \
    --wrap "$step finalize")
echo "submitted: digest $digest, parts $parts (array 0-$((XPACKFS_PARTS - 1))), finalize $final"
