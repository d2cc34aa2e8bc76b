#!/usr/bin/env bash
# Device buffers across "nodes": two ranks on one machine told they are on two nodes
# (LOOM_NODE_ID), so every collective on device memory crosses through pinned host memory and
# the proxy thread (src/cuda/dev.c), checked bit for bit by loom-perf. 77 without 2 GPUs.
# Usage: tests/gpu/staged.sh [BUILD_DIR]
set -uo pipefail
dir=${1:-${LOOM_BUILD_DIR:-build}}
perf=$dir/loom-perf
[ -x "$perf" ] || { echo "staged: $perf not built"; exit 2; }
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${n:-0}" -ge 2 ] || { echo "staged: needs 2 GPUs (found ${n:-0}): skipped"; exit 77; }
export LOOM_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
fail=0
# check LABEL NODE_IDS RANKS loom-perf-args...: one checked loom-perf run.
check() {
    local label=$1 ids=$2 ranks=$3 log
    shift 3
    log=/tmp/staged_${label// /_}.txt
    if LOOM_NODE_ID=$ids "$perf" -P "$ranks" --mem device -n 3 -w 1 -c 1 "$@" >"$log" 2>&1; then
        echo "ok   staged $label"
    else
        echo "FAIL staged $label:"
        tail -20 "$log"
        fail=$((fail + 1))
    fi
}
two=staged-node-a,staged-node-b
for c in allreduce broadcast reduce allgather reducescatter alltoall; do
    for t in float bfloat16 int32; do
        check "$c $t" $two 2 -C "$c" -d "$t" -b 8 -e 64M -f 16
    done
done
# avg and a pre-multiplied sum go through the host reduction of the proxy
for o in avg max; do
    check "allreduce $o" $two 2 -C allreduce -o "$o" -b 8 -e 16M -f 16
done
# Two GPUs on each of two "nodes" (4 ranks, rank r on GPU r mod 2; the two ranks of a GPU are
# on different nodes): the hierarchical device allreduce (reduce-scatter over NVLink inside the
# node, the shards across nodes through pinned memory, allgather over NVLink).
for t in float bfloat16 int32; do
    check "hierarchical allreduce 2x2 $t" staged-node-a,staged-node-a,staged-node-b,staged-node-b \
        4 -C allreduce -d "$t" -b 8 -e 16M -f 16
done
echo "staged: $fail failed"
[ "$fail" -eq 0 ]
