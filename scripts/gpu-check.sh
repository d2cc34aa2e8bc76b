#!/usr/bin/env bash
# The whole GPU check in one command, for the GPU machine (Ubuntu + CUDA, no package access):
# builds loom there (meson when present, else one cc line), runs the GPU-side tests, and prints
# a summary. Results go to $OUT when set. Never touches clocks, resets, or NVLink multicast.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/loom-gpu}
mkdir -p "$out" build-gpu
srcs=$(sed -n "/^loom_src = files(/,/^)/p" meson.build | grep -o "'src/[^']*\.c'" | tr -d "'")
# shellcheck disable=SC2086
cc -std=c11 -O2 -D_GNU_SOURCE -fPIC -shared -fvisibility=hidden -Iinclude -Isrc/base \
    -Isrc/transport -Isrc/core -Isrc/ring -Isrc/hier $srcs -o build-gpu/libloom.so \
    -lpthread -lm -ldl || { echo "build failed"; exit 1; }
cc -std=c11 -O2 -Iinclude tests/gpu/gpu_guard.c -Lbuild-gpu -lloom -Wl,-rpath,"$PWD/build-gpu" \
    -ldl -o build-gpu/gpu_guard || { echo "build failed"; exit 1; }
nvidia-smi -L 2>&1 | tee "$out/gpus.txt"
pass=0 fail=0
LOOM_SOCKET_IFNAME=lo build-gpu/gpu_guard 2>&1 | tee "$out/gpu_guard.txt"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then pass=$((pass + 1)); elif [ "$rc" -ne 77 ]; then fail=$((fail + 1)); fi
echo "$pass passed, $fail failed"
