#!/usr/bin/env bash
# Bench-only dependencies (not CI's: scripts/setup.sh stays lean): PyTorch from Debian's archive
# (python3-torch, for /usr/bin/python3; its libtorch is several hundred MB) for
# perf/fusion-ddp.py, the PyTorch DDP side of perf/fusion-compare.sh.
set -euo pipefail
pkgs=(python3-torch)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bench-deps: installing ${missing[*]}"
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi
/usr/bin/python3 -c 'import torch, torch.distributed as d; print("bench-deps: torch", torch.__version__, "gloo", d.is_gloo_available())'
