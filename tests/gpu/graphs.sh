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
. "$(dirname "$0")/lib.sh"
gpu_begin graphs coll perf share
# a kernel waits for its peer a few time slices at most here: a mismatch fails in seconds
export LOOM_TIMEOUT=${LOOM_TIMEOUT:-15}
# the defaults, logging the CUDA subsystem: graphs must let go of the mappings their direct
# calls held (so the direct path was captured, not replaced by the slots)
gpu_run -e "mappings of peers' buffers let go" "graphs gpu_coll graphs (LOOM_CUDA_LL=default)" \
    "$out/graphs_coll_lldefault.txt" env LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=CUDA \
    timeout -k 10 400 "$coll" --only graphs
gpu_run "graphs gpu_coll graphs (LOOM_CUDA_LL=0)" "$out/graphs_coll_ll0.txt" \
    env LOOM_CUDA_LL=0 timeout -k 10 400 "$coll" --only graphs
for r in 0 2; do
    for c in allreduce reducescatter allgather broadcast; do
        gpu_run -s none -e '^# nThread.* graph: 10$' "graphs loom-perf -R $r -G 10 $c" \
            "$out/graphs_perf_R${r}_$c.txt" timeout -k 10 300 "$perf" -P 2 --mem device -R $r \
            -G 10 --collective "$c" -d float -o sum -b 8 -e 16M -f 8 -n 2 -w 1 -c 1
    done
done
# no warm-up: the communicator's first device call (its setup) is made while the stream is
# being captured (thread-local mode)
gpu_run -s none "graphs loom-perf -G 2 -w 0 (setup under capture)" \
    "$out/graphs_perf_first_captured.txt" timeout -k 10 300 "$perf" -P 2 --mem device -G 2 \
    -w 0 -n 3 -d float -o sum -b 4K -e 4M -f 1024 -c 1
# GPU time per call: graph replays (-G 10: 10 launches of a graph of 20 calls) against 20 calls
# made one by one (-G 0), plain and on windows (on a shared GPU: the two ranks' kernels take
# turns, provisional)
for r in 0 2; do
    for g in 0 10; do
        gpu_run -s all "graphs --gpu-time -R $r -G $g" "$out/graphs_gputime_R${r}_G$g.txt" \
            timeout -k 10 300 "$perf" -P 2 --mem device -R $r -G $g --gpu-time -d float \
            -o sum -b 8 -e 16M -f 8 -n 20 -w 5 -c 1
    done
done
gpu_end
