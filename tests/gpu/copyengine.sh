#!/usr/bin/env bash
# The copy-engine path (src/cuda/dev_ce.c) on one GPU: two ranks share it
# (LOOM_CUDA_SHARE_GPU=1, a testing knob: their kernels and copies take turns, so this checks
# results, not speed). The path's threshold is lowered to 1 MiB and its scratch to 2 MiB, so that
# every call from 1 MiB takes it in pieces of 1 MiB and reuses both halves of the scratch:
#   1. gpu_coll's "ce" group (allreduce of 6 types x sum/max/avg, reduce-scatter, allgather,
#      broadcast from every root, in and out of place, views at several offsets), logging the
#      CUDA subsystem: the log must show the path set up on both ranks (so it was taken);
#   2. gpu_coll's "graphs" and "win" groups the same way (the path captured in CUDA graphs and
#      replayed; buffers in non-symmetric windows);
#   3. loom-perf -c 1 over the four collectives from 1 MiB to 64 MiB; and with a scratch too large
#      to allocate (a WARN, then the SM paths on both ranks, results still exact);
#   4. measurements (provisional on a shared GPU): ce_rate (the engines' rate on this GPU) and
#      loom-perf --gpu-time of allreduce and allgather, 64 MiB to 1 GiB, on the copy engines
#      (LOOM_CUDA_CE=1M) against the SM paths (LOOM_CUDA_CE=0).
# 77 without a GPU.
# Usage: tests/gpu/copyengine.sh [BUILD_DIR]
set -uo pipefail
dir=${1:-${LOOM_BUILD_DIR:-build}}
. "$(dirname "$0")/lib.sh"
gpu_begin copyengine coll perf share
export LOOM_TIMEOUT=${LOOM_TIMEOUT:-30}
ce=(env LOOM_CUDA_CE=1M LOOM_CUDA_CE_SCRATCH=2M)
# the log must show the path set up on both ranks
for g in ce graphs win; do
    gpu_run -e 'copy-engine path \(from 1048576 bytes\)' -m 2 "copyengine gpu_coll $g" \
        "$out/copyengine_coll_$g.txt" "${ce[@]}" LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=CUDA \
        timeout -k 10 420 "$coll" --only "$g"
done
for c in allreduce reducescatter allgather broadcast; do
    gpu_run -s none "copyengine loom-perf -c 1 $c" "$out/copyengine_perf_$c.txt" "${ce[@]}" \
        timeout -k 10 300 "$perf" -P 2 --mem device --collective "$c" -d float -o sum \
        -b 1M -e 64M -f 4 -n 2 -w 1 -c 1
done
# a scratch that cannot be allocated: a WARN, and every rank's large calls on the SM paths
for c in allreduce allgather; do
    gpu_run -s none -e 'stay on the SM paths' "copyengine without its scratch: $c" \
        "$out/copyengine_noscratch_$c.txt" env LOOM_CUDA_CE=1M LOOM_CUDA_CE_SCRATCH=100T \
        timeout -k 10 300 "$perf" -P 2 --mem device --collective "$c" -d float -o sum \
        -b 4M -e 16M -f 4 -n 2 -w 1 -c 1
done
if [ -x "$dir/ce_rate" ]; then
    timeout -k 10 120 "$dir/ce_rate" | tee "$out/copyengine_ce_rate.txt"
fi
for c in allreduce allgather; do
    for v in 1M 0; do
        gpu_run -s all "copyengine --gpu-time $c LOOM_CUDA_CE=$v" \
            "$out/copyengine_gputime_${c}_ce$v.txt" env LOOM_CUDA_CE=$v timeout -k 10 300 \
            "$perf" -P 2 --mem device --collective "$c" --gpu-time -d float -o sum -b 64M \
            -e 1G -f 4 -n 5 -w 2
    done
done
gpu_end
