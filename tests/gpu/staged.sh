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
export LOOM_NODE_ID=staged-node-a,staged-node-b LOOM_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
fail=0
for c in allreduce broadcast reduce allgather reducescatter alltoall; do
    for t in float bfloat16 int32; do
        if "$perf" -P 2 --mem device -C "$c" -d "$t" -b 8 -e 64M -f 16 -n 3 -w 1 -c 1 \
            >"/tmp/staged_${c}_${t}.txt" 2>&1; then
            echo "ok   staged $c $t"
        else
            echo "FAIL staged $c $t:"
            tail -20 "/tmp/staged_${c}_${t}.txt"
            fail=$((fail + 1))
        fi
    done
done
# avg and a pre-multiplied sum go through the host reduction of the proxy
for o in avg max; do
    if "$perf" -P 2 --mem device -C allreduce -o "$o" -b 8 -e 16M -f 16 -n 3 -w 1 -c 1 \
        >/tmp/staged_op.txt 2>&1; then
        echo "ok   staged allreduce $o"
    else
        echo "FAIL staged allreduce $o:"
        tail -20 /tmp/staged_op.txt
        fail=$((fail + 1))
    fi
done
# Two GPUs on each of two "nodes" (4 ranks, rank r on GPU r mod 2; the two ranks of a GPU are
# on different nodes): the hierarchical device allreduce (reduce-scatter over NVLink inside the
# node, the shards across nodes through pinned memory, allgather over NVLink).
for t in float bfloat16 int32; do
    if LOOM_NODE_ID=staged-node-a,staged-node-a,staged-node-b,staged-node-b \
        "$perf" -P 4 --mem device -C allreduce -d "$t" -b 8 -e 16M -f 16 -n 3 -w 1 -c 1 \
        >/tmp/staged_hier.txt 2>&1; then
        echo "ok   staged hierarchical allreduce 2x2 $t"
    else
        echo "FAIL staged hierarchical allreduce 2x2 $t:"
        tail -20 /tmp/staged_hier.txt
        fail=$((fail + 1))
    fi
done
echo "staged: $fail failed"
[ "$fail" -eq 0 ]
