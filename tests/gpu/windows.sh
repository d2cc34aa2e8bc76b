#!/usr/bin/env bash
# Registered windows (loomCommWindowRegister) on one GPU: two ranks share it
# (LOOM_CUDA_SHARE_GPU=1, a testing knob; their kernels take turns, so this checks results, not
# speed). Runs gpu_coll's "win" group twice: with the defaults (small allreduces and
# reduce-scatters keep the latency path) and with LOOM_CUDA_LL=0 (the window kernels at every
# size); its "kill" group (a peer SIGKILLed, once with its windows mapped); then loom-perf -R 2
# (nccl-tests' symmetric registration) with -c 1 over the four window collectives, and
# --gpu-time of a window allreduce against an unregistered one.
# 77 without a GPU.
# Usage: tests/gpu/windows.sh [BUILD_DIR]
set -uo pipefail
dir=${1:-${LOOM_BUILD_DIR:-build}}
. "$(dirname "$0")/lib.sh"
gpu_begin windows coll perf share
for ll in default 0; do
    set=()
    [ "$ll" = default ] || set=(LOOM_CUDA_LL=$ll)
    gpu_run "windows gpu_coll win (LOOM_CUDA_LL=$ll)" "$out/windows_coll_ll$ll.txt" \
        env "${set[@]}" timeout -k 10 400 "$coll" --only win
done
# the kill test on the shared GPU: rank 1 SIGKILLed with its windows mapped by rank 0 (and the
# direct and latency paths' runs beside it); rank 0 must report rank 1 and drain its stream
gpu_run "windows gpu_coll kill (shared GPU)" "$out/windows_kill.txt" \
    timeout -k 10 400 "$coll" --only kill
for c in allreduce reducescatter allgather broadcast; do
    gpu_run -s none "windows loom-perf -R 2 $c" "$out/windows_perf_$c.txt" \
        timeout -k 10 300 "$perf" -P 2 --mem device -R 2 --collective "$c" -d float -o sum \
        -b 8 -e 16M -f 8 -n 2 -w 1 -c 1
done
# GPU time per call, windows (-R 2) and not (-R 0), LOOM_CUDA_LL=0 so that the window kernel runs
# at the small sizes too (on a shared GPU: the two ranks' kernels take turns, provisional)
for r in 0 2; do
    gpu_run -s all "windows --gpu-time -R $r" "$out/windows_gputime_R$r.txt" \
        env LOOM_CUDA_LL=0 timeout -k 10 300 "$perf" -P 2 --mem device -R $r --gpu-time \
        -d float -o sum -b 8 -e 8M -f 16 -n 20 -w 5
done
gpu_end
