#!/usr/bin/env bash
# Installs what loom needs from Debian's archive (when missing) and builds it with -Werror.
# Usage: scripts/setup.sh [build-dir]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
builddir=${1:-build}
export PATH=/usr/local/cuda/bin:$PATH

pkgs=(meson ninja-build pkg-config gcc check libopenmpi-dev openmpi-bin libpmix-dev libsodium-dev
      libgloo-dev g++ iproute2 clang-format valgrind python3-matplotlib libucx-dev ucx-utils clang
      libclang-rt-14-dev
      mpich)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

if [ ! -f "$builddir/build.ninja" ]; then
    meson setup "$builddir" -Dwerror=true >/dev/null
else
    meson setup --reconfigure "$builddir" -Dwerror=true >/dev/null
fi
ninja -C "$builddir" >/dev/null
echo "setup: built in $builddir"
