#!/usr/bin/env bash
# The libraries loom's build needs that the GPU machine lacks and cannot install (it has no
# package access): run here, on the Debian development machine, before sending the tree there.
# Downloads Debian's .deb files of each into .gpu-deps/ (ignored by git); name .gpu-deps in the
# run's carry list, and scripts/gpu-check.sh unpacks them there when pkg-config finds no copy of
# its own. Today: libsodium (the handshake's cryptography).
# Usage: scripts/gpu-deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-deps
cd .gpu-deps
# apt-get download as root warns that _apt cannot write here: harmless, the files arrive
apt-get download libsodium-dev libsodium23 2>&1 | grep -v "unsandboxed" || true
ls -1 ./*.deb
