#!/usr/bin/env bash
# Install what xpackfs and its tests need on a fresh Debian machine (run as root):
# fuse3 (mount.fuse3, fusermount3), util-linux (mount, unshare), util-linux-extra (fincore,
# which the page-cache tests use), the Python peers, Azurite (npm) for the remote-source tests.
set -euo pipefail
need_apt=()
command -v mount.fuse3 >/dev/null || need_apt+=(fuse3)
command -v unshare >/dev/null || need_apt+=(util-linux)
command -v fincore >/dev/null || need_apt+=(util-linux-extra)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
command -v git >/dev/null || need_apt+=(git)
command -v g++ >/dev/null || need_apt+=(g++)  # the reference ggml (tools/build_ggml_ref.sh)
command -v openssl >/dev/null || need_apt+=(openssl)  # the HTTPS test's CA (servers.py http --tls)
if ((${#need_apt[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/requirements.txt"
# Azurite, the Azure blob emulator of the remote-source tests (tools/peers/remote/servers.py azurite).
if ! command -v azurite-blob >/dev/null; then
  command -v npm >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
  npm install -g --silent azurite@3.35.0 >/dev/null
fi
