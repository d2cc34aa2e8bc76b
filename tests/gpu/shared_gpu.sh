#!/usr/bin/env bash
# Two ranks of one node on one GPU (LOOM_CUDA_SHARE_GPU=1, a testing knob: the two processes'
# kernels take turns on the GPU, so every exchange waits for a time slice), so that the
# same-node device paths (low-latency words, slots, direct reads through CUDA IPC) can be
# checked bit for bit on a machine with a single GPU. 77 without a GPU.
# Usage: tests/gpu/shared_gpu.sh [BUILD_DIR]
set -uo pipefail
dir=${1:-${LOOM_BUILD_DIR:-build}}
perf=$dir/loom-perf
[ -x "$perf" ] || { echo "shared_gpu: $perf not built"; exit 2; }
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${n:-0}" -ge 1 ] || { echo "shared_gpu: no GPU: skipped"; exit 77; }
export LOOM_CUDA_SHARE_GPU=1 CUDA_VISIBLE_DEVICES=0 LOOM_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
fail=0
for c in allreduce reducescatter allgather broadcast; do
    log=/tmp/shared_gpu_$c.txt ops=all
    [ "$c" = allgather ] || [ "$c" = broadcast ] && ops=sum
    # 8 B, 512 B, 32 KiB, 2 MiB: the latency path and the slots, every type and op
    if "$perf" -P 2 --mem device --collective "$c" -d all -o "$ops" -b 8 -e 4M -f 64 -n 2 -w 1 -c 1 \
        >"$log" 2>&1; then
        echo "ok   shared_gpu $c"
    else
        echo "FAIL shared_gpu $c:"
        tail -20 "$log"
        fail=$((fail + 1))
    fi
done
echo "shared_gpu: $fail failed"
[ "$fail" -eq 0 ]
