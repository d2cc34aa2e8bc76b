#!/usr/bin/env bash
# CUDA graphs on one GPU: two ranks share it (LOOM_CUDA_SHARE_GPU=1, a testing knob; their
# kernels take turns, so this checks results, not speed). Runs gpu_coll's "graphs" group twice:
# with the defaults (small allreduces and reduce-scatters on the latency path, consecutive ones
# captured with programmatic edges) and with LOOM_CUDA_LL=0 (the slots and the window kernels
# at every size). The first run logs the CUDA subsystem (LOOM_DEBUG=INFO) and must show
# graphs letting go of the peers' mappings their direct calls held (so the direct path was
# captured, not replaced by the slots). Then loom-perf -G 10 (nccl-tests' --cudagraph) with
# -c 1 over the four collectives, plain and on windows (-R 2), and --gpu-time of graph replays
# against calls made one by one (-G 0).
# 77 without a GPU.
# Usage: tests/gpu/graphs.sh [BUILD_DIR]
set -uo pipefail
dir=${1:-${LOOM_BUILD_DIR:-build}}
coll=$dir/tests/gpu_coll perf=$dir/loom-perf
[ -x "$coll" ] || { echo "graphs: $coll not built"; exit 2; }
[ -x "$perf" ] || { echo "graphs: $perf not built"; exit 2; }
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${n:-0}" -ge 1 ] || { echo "graphs: no GPU: skipped"; exit 77; }
export LOOM_CUDA_SHARE_GPU=1 CUDA_VISIBLE_DEVICES=0 LOOM_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
# a kernel waits for its peer a few time slices at most here: a mismatch fails in seconds
export LOOM_TIMEOUT=${LOOM_TIMEOUT:-15}
out=${OUT:-/tmp}
fail=0
for ll in default 0; do
    log=$out/graphs_coll_ll$ll.txt
    if [ "$ll" = default ]; then
        LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=CUDA timeout -k 10 400 "$coll" --only graphs \
            >"$log" 2>&1
    else
        LOOM_CUDA_LL=0 timeout -k 10 400 "$coll" --only graphs >"$log" 2>&1
    fi
    rc=$?
    if [ $rc -eq 0 ]; then
        echo "ok   graphs gpu_coll graphs (LOOM_CUDA_LL=$ll): $(tail -1 "$log")"
    else
        echo "FAIL graphs gpu_coll graphs (LOOM_CUDA_LL=$ll), exit $rc:"
        grep -E '^FAIL' "$log" | head -20
        tail -3 "$log"
        fail=$((fail + 1))
    fi
    if [ "$ll" = default ]; then
        let_go=$(grep -c "mappings of peers' buffers let go" "$log")
        if [ "$let_go" -gt 0 ]; then
            echo "ok   graphs: $let_go graphs let go of the mappings their direct calls held"
        else
            echo "FAIL graphs: no graph held mappings of a direct call (was the direct path" \
                "captured?)"
            fail=$((fail + 1))
        fi
    fi
done
for r in 0 2; do
    for c in allreduce reducescatter allgather broadcast; do
        log=$out/graphs_perf_R${r}_$c.txt
        if timeout -k 10 300 "$perf" -P 2 --mem device -R $r -G 10 --collective "$c" -d float \
            -o sum -b 8 -e 16M -f 8 -n 2 -w 1 -c 1 >"$log" 2>&1 &&
            grep -q '^# nThread.* graph: 10$' "$log"; then
            echo "ok   graphs loom-perf -R $r -G 10 $c"
        else
            echo "FAIL graphs loom-perf -R $r -G 10 $c:"
            tail -20 "$log"
            fail=$((fail + 1))
        fi
    done
done
# no warm-up: the communicator's first device call (its setup) is made while the stream is
# being captured (thread-local mode)
log=$out/graphs_perf_first_captured.txt
if timeout -k 10 300 "$perf" -P 2 --mem device -G 2 -w 0 -n 3 -d float -o sum -b 4K -e 4M \
    -f 1024 -c 1 >"$log" 2>&1; then
    echo "ok   graphs loom-perf -G 2 -w 0 (setup under capture)"
else
    echo "FAIL graphs loom-perf -G 2 -w 0 (setup under capture):"
    tail -20 "$log"
    fail=$((fail + 1))
fi
# GPU time per call: graph replays (-G 10: 10 launches of a graph of 20 calls) against 20 calls
# made one by one (-G 0), plain and on windows (on a shared GPU: the two ranks' kernels take
# turns, provisional)
for r in 0 2; do
    for g in 0 10; do
        log=$out/graphs_gputime_R${r}_G$g.txt
        if timeout -k 10 300 "$perf" -P 2 --mem device -R $r -G $g --gpu-time -d float -o sum \
            -b 8 -e 16M -f 8 -n 20 -w 5 -c 1 >"$log" 2>&1; then
            echo "ok   graphs --gpu-time -R $r -G $g"
            cat "$log"
        else
            echo "FAIL graphs --gpu-time -R $r -G $g:"
            tail -20 "$log"
            fail=$((fail + 1))
        fi
    done
done
echo "graphs: $fail failed"
[ "$fail" -eq 0 ]
