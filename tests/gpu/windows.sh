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
coll=$dir/tests/gpu_coll perf=$dir/loom-perf
[ -x "$coll" ] || { echo "windows: $coll not built"; exit 2; }
[ -x "$perf" ] || { echo "windows: $perf not built"; exit 2; }
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${n:-0}" -ge 1 ] || { echo "windows: no GPU: skipped"; exit 77; }
export LOOM_CUDA_SHARE_GPU=1 CUDA_VISIBLE_DEVICES=0 LOOM_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp}
fail=0
for ll in default 0; do
    log=$out/windows_coll_ll$ll.txt
    if [ "$ll" = default ]; then
        timeout -k 10 400 "$coll" --only win >"$log" 2>&1
    else
        LOOM_CUDA_LL=0 timeout -k 10 400 "$coll" --only win >"$log" 2>&1
    fi
    rc=$?
    if [ $rc -eq 0 ]; then
        echo "ok   windows gpu_coll win (LOOM_CUDA_LL=$ll): $(tail -1 "$log")"
    else
        echo "FAIL windows gpu_coll win (LOOM_CUDA_LL=$ll), exit $rc:"
        grep -E '^FAIL' "$log" | head -20
        tail -3 "$log"
        fail=$((fail + 1))
    fi
done
# the kill test on the shared GPU: rank 1 SIGKILLed with its windows mapped by rank 0 (and the
# direct and latency paths' runs beside it); rank 0 must report rank 1 and drain its stream
log=$out/windows_kill.txt
if timeout -k 10 400 "$coll" --only kill >"$log" 2>&1; then
    echo "ok   windows gpu_coll kill (shared GPU): $(tail -1 "$log")"
else
    echo "FAIL windows gpu_coll kill (shared GPU):"
    grep -E '^FAIL' "$log" | head -20
    tail -3 "$log"
    fail=$((fail + 1))
fi
for c in allreduce reducescatter allgather broadcast; do
    log=$out/windows_perf_$c.txt
    if timeout -k 10 300 "$perf" -P 2 --mem device -R 2 --collective "$c" -d float -o sum \
        -b 8 -e 16M -f 8 -n 2 -w 1 -c 1 >"$log" 2>&1; then
        echo "ok   windows loom-perf -R 2 $c"
    else
        echo "FAIL windows loom-perf -R 2 $c:"
        tail -20 "$log"
        fail=$((fail + 1))
    fi
done
# GPU time per call, windows (-R 2) and not (-R 0), LOOM_CUDA_LL=0 so that the window kernel runs
# at the small sizes too (on a shared GPU: the two ranks' kernels take turns, provisional)
for r in 0 2; do
    log=$out/windows_gputime_R$r.txt
    if LOOM_CUDA_LL=0 timeout -k 10 300 "$perf" -P 2 --mem device -R $r --gpu-time -d float \
        -o sum -b 8 -e 8M -f 16 -n 20 -w 5 >"$log" 2>&1; then
        echo "ok   windows --gpu-time -R $r"
        cat "$log"
    else
        echo "FAIL windows --gpu-time -R $r:"
        tail -20 "$log"
        fail=$((fail + 1))
    fi
done
echo "windows: $fail failed"
[ "$fail" -eq 0 ]
