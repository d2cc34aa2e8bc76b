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
coll=$dir/tests/gpu_coll
[ -x "$coll" ] || { echo "fusion: $coll not built"; exit 2; }
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${n:-0}" -ge 1 ] || { echo "fusion: no GPU: skipped"; exit 77; }
export LOOM_CUDA_SHARE_GPU=1 CUDA_VISIBLE_DEVICES=0 LOOM_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp}
fail=0
for ll in default 0; do
    log=$out/fusion_coll_ll$ll.txt
    if [ "$ll" = default ]; then
        timeout -k 10 300 "$coll" --only fusion,groupfuse >"$log" 2>&1
    else
        LOOM_CUDA_LL=0 timeout -k 10 300 "$coll" --only fusion,groupfuse >"$log" 2>&1
    fi
    rc=$?
    if [ $rc -eq 0 ]; then
        echo "ok   fusion gpu_coll fusion (LOOM_CUDA_LL=$ll): $(tail -1 "$log")"
    else
        echo "FAIL fusion gpu_coll fusion (LOOM_CUDA_LL=$ll), exit $rc:"
        grep -E '^FAIL' "$log" | head -20
        tail -3 "$log"
        fail=$((fail + 1))
    fi
done
log=$out/fusion_groupfuse_trace.txt
LOOM_DEBUG=TRACE LOOM_DEBUG_SUBSYS=CUDA timeout -k 10 300 "$coll" --only groupfuse >"$log" 2>&1
rc=$?
runs=$(grep -c 'allreduces of a group fused into one' "$log" || true)
if [ $rc -eq 0 ] && [ "${runs:-0}" -gt 0 ]; then
    echo "ok   fusion groupfuse with LOOM_DEBUG=TRACE: $runs fused runs logged: $(tail -1 "$log")"
else
    echo "FAIL fusion groupfuse with LOOM_DEBUG=TRACE: exit $rc, ${runs:-0} fused runs logged"
    grep -E '^FAIL' "$log" | head -5
    fail=$((fail + 1))
fi
[ $fail -eq 0 ]
