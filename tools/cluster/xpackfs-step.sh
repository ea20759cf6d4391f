#!/usr/bin/env bash
# One step of a materialize split across machines; the same script runs under Slurm
# (slurm-materialize.sh) and Kubernetes (k8s-materialize.yaml), or by hand.
#
#   xpackfs-step.sh digest     hash the source once into the shared digest store
#   xpackfs-step.sh part [I]   write part I of N (I defaults to $XPACKFS_PART, else
#                              $SLURM_ARRAY_TASK_ID, else $JOB_COMPLETION_INDEX)
#   xpackfs-step.sh finalize   check every part, assemble cut files, write the manifests, verify
#
# Environment (the same for every step):
#   XPACKFS_SOURCE        GGUF file or safetensors directory, on a shared filesystem (required)
#   XPACKFS_OUT           output directory, on a shared filesystem (required)
#   XPACKFS_PARTS         number of parts N (required for `part`)
#   XPACKFS_OPTIONS       view options as for `-o` (default: empty, the source's default view)
#   XPACKFS_PIECE_SIZE    files larger than this are cut across parts (default 1G)
#   XPACKFS_DIGEST_STORE  shared digest store (default: $XPACKFS_OUT.digests)
#   XPACKFS_BIN           the xpackfs binary (default: xpackfs on PATH)
#
# A part that is run again (requeued job, restarted pod) continues where it stopped.
set -euo pipefail

step=${1:?usage: xpackfs-step.sh digest|part [I]|finalize}
source_path=${XPACKFS_SOURCE:?set XPACKFS_SOURCE}
out=${XPACKFS_OUT:?set XPACKFS_OUT}
bin=${XPACKFS_BIN:-xpackfs}
store=${XPACKFS_DIGEST_STORE:-${out%/}.digests}
opts=${XPACKFS_OPTIONS:-}
opts="${opts:+$opts,}digest_store=$store"
piece=${XPACKFS_PIECE_SIZE:-1G}

case "$step" in
digest)
    exec "$bin" digest "$source_path" --digest-store "$store"
    ;;
part)
    parts=${XPACKFS_PARTS:?set XPACKFS_PARTS}
    index=${2:-${XPACKFS_PART:-${SLURM_ARRAY_TASK_ID:-${JOB_COMPLETION_INDEX:-}}}}
    [ -n "$index" ] || { echo "xpackfs-step.sh: no part index (XPACKFS_PART, SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX)" >&2; exit 2; }
    exec "$bin" materialize "$source_path" --out "$out" -o "$opts" --partition "$index/$parts" --piece-size "$piece"
    ;;
finalize)
    exec "$bin" materialize "$source_path" --out "$out" -o "$opts" --finalize --verify --json
    ;;
*)
    echo "xpackfs-step.sh: unknown step $step (digest, part, finalize)" >&2
    exit 2
    ;;
esac
