#!/usr/bin/env bash
# Fusion on device tensors: gpu_coll's "fusion" group (fusion contexts) and "groupfuse" group (a
# group's small allreduces fused by the device executor), two ranks sharing GPU 0
# (LOOM_CUDA_SHARE_GPU=1, a testing knob: this checks results, not speed), once with the
# defaults and once with LOOM_CUDA_LL=0 (the allreduces on the slot and direct paths at every
# size); then groupfuse again with LOOM_DEBUG=TRACE, which must log fused runs (a check that the
# fusion ran, not only that the results are right); and the fusion group with a tuning file
# whose device section must set a device context's sizes, and loom-tune --fusion --mem device
# writing that section. 77 without a GPU.
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
# a tuning file whose host and device sections differ: the "default sizes" case's context starts
# with the host sizes and takes the device ones at its first device tensor
tune=$out/fusion_tune.txt
printf '[ranks=* mem=host]\nfusion_threshold = 7000000\nfusion_segment = 500000\n[ranks=* mem=device]\nfusion_threshold = 3000000\nfusion_segment = 200000\n' >"$tune"
gpu_run -e '^ok .*from the tuning file: host, then device section' \
    "fusion gpu_coll fusion, sizes from LOOM_TUNE_FILE's device section" \
    "$out/fusion_coll_tuned.txt" env LOOM_TUNE_FILE="$tune" \
    GPU_COLL_FUSION_TUNED="7000000 500000 3000000 200000" timeout -k 10 300 "$coll" --only fusion
# loom-tune's search on device tensors writes the mem=device section
tune_dev=$out/fusion_tune_device.txt
rm -f "$tune_dev"
gpu_run -s none -e '^\[ranks=2 layout=1x2 mem=device\]' "fusion loom-tune --fusion --mem device" \
    "$out/fusion_loom_tune_device.txt" timeout -k 10 300 "$dir/loom-tune" --fusion --mem device \
    -P 2 -m data/fusion/resnet50.csv -r 1 -o "$tune_dev"
gpu_run -e 'allreduces of a group fused into one' "fusion groupfuse with LOOM_DEBUG=TRACE" \
    "$out/fusion_groupfuse_trace.txt" env LOOM_DEBUG=TRACE LOOM_DEBUG_SUBSYS=CUDA \
    timeout -k 10 300 "$coll" --only groupfuse
gpu_end
