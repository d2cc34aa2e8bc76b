#!/usr/bin/env bash
# Fusion on device tensors: gpu_coll's "fusion" group (fusion contexts) and "groupfuse" group (a
# group's small allreduces fused by the device executor), two ranks sharing GPU 0
# (LOOM_CUDA_SHARE_GPU=1, a testing knob: this checks results, not speed), once with the
# defaults and once with LOOM_CUDA_LL=0 (the allreduces on the slot and direct paths at every
# size); then groupfuse again with LOOM_DEBUG=TRACE, which must log fused runs (a check that the
# fusion ran, not only that the results are right). 77 without a GPU.
# Usage: tests/gpu/fusion.sh [BUILD_DIR]
set -uo pipefail
dir=${1:-${LOOM_BUILD_DIR:-build}}
. "$(dirname "$0")/lib.sh"
gpu_begin fusion coll share
for ll in default 0; do
    set=()
    [ "$ll" = default ] || set=(LOOM_CUDA_LL=$ll)
    gpu_run "fusion gpu_coll fusion,groupfuse (LOOM_CUDA_LL=$ll)" "$out/fusion_coll_ll$ll.txt" \
        env "${set[@]}" timeout -k 10 300 "$coll" --only fusion,groupfuse
done
gpu_run -e 'allreduces of a group fused into one' "fusion groupfuse with LOOM_DEBUG=TRACE" \
    "$out/fusion_groupfuse_trace.txt" env LOOM_DEBUG=TRACE LOOM_DEBUG_SUBSYS=CUDA \
    timeout -k 10 300 "$coll" --only groupfuse
gpu_end
