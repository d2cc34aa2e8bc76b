#!/usr/bin/env bash
# Device buffers across "nodes": two ranks on one machine told they are on two nodes
# (LOOM_NODE_ID), so every collective on device memory crosses through pinned host memory and
# the host collectives that the process's progress thread runs for it (src/cuda/dev_stage.c,
# src/core/progress.c), checked bit for bit by loom-perf. With a single GPU the ranks share it
# (LOOM_CUDA_SHARE_GPU=1). 77 without a GPU.
# Usage: tests/gpu/staged.sh [BUILD_DIR]
set -uo pipefail
dir=${1:-${LOOM_BUILD_DIR:-build}}
. "$(dirname "$0")/lib.sh"
gpu_begin staged perf
if [ "$ngpu" -lt 2 ]; then
    echo "staged: one GPU: the ranks share it (LOOM_CUDA_SHARE_GPU=1)"
    export LOOM_CUDA_SHARE_GPU=1 CUDA_VISIBLE_DEVICES=0
fi
# check LABEL NODE_IDS RANKS loom-perf-args...: one checked loom-perf run.
check() {
    local label=$1 ids=$2 ranks=$3
    shift 3
    gpu_run -s none "staged $label" "$out/staged_${label// /_}.txt" env LOOM_NODE_ID="$ids" \
        "$perf" -P "$ranks" --mem device -n 3 -w 1 -c 1 "$@"
}
two=staged-node-a,staged-node-b
for c in allreduce broadcast reduce allgather reducescatter alltoall; do
    for t in float bfloat16 int32; do
        check "$c $t" $two 2 --collective "$c" -d "$t" -b 8 -e 64M -f 16
    done
done
# avg and max go through the host reduction of the staged path
for o in avg max; do
    check "allreduce $o" $two 2 --collective allreduce -o "$o" -b 8 -e 16M -f 16
done
# Two GPUs on each of two "nodes" (4 ranks, rank r on GPU r mod 2; the two ranks of a GPU are
# on different nodes): the hierarchical device allreduce (reduce-scatter over NVLink inside the
# node, the shards across nodes through pinned memory, allgather over NVLink).
for t in float bfloat16 int32; do
    check "hierarchical allreduce 2x2 $t" staged-node-a,staged-node-a,staged-node-b,staged-node-b \
        4 --collective allreduce -d "$t" -b 8 -e 16M -f 16
done
gpu_end
