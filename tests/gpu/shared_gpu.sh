#!/usr/bin/env bash
# Two ranks of one node on one GPU (LOOM_CUDA_SHARE_GPU=1, a testing knob: the two processes'
# kernels take turns on the GPU, so every exchange waits for a time slice), so that the
# same-node device paths (low-latency words, slots, direct reads through CUDA IPC) can be
# checked bit for bit on a machine with a single GPU. 77 without a GPU.
# Usage: tests/gpu/shared_gpu.sh [BUILD_DIR]
set -uo pipefail
dir=${1:-${LOOM_BUILD_DIR:-build}}
. "$(dirname "$0")/lib.sh"
gpu_begin shared_gpu perf share
for c in allreduce reducescatter allgather broadcast; do
    ops=all
    [ "$c" = allgather ] || [ "$c" = broadcast ] && ops=sum
    # 8 B, 512 B, 32 KiB, 2 MiB: the latency path and the slots, every type and op
    gpu_run -s none "shared_gpu $c" "$out/shared_gpu_$c.txt" "$perf" -P 2 --mem device \
        --collective "$c" -d all -o "$ops" -b 8 -e 4M -f 64 -n 2 -w 1 -c 1
done
gpu_end
