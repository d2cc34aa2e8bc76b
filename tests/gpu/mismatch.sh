#!/usr/bin/env bash
# Ranks of one node whose device collectives differ, on one GPU: two ranks share it
# (LOOM_CUDA_SHARE_GPU=1, a testing knob). Runs gpu_coll's "mismatch" group: an allreduce whose
# count differs, one whose op differs, a broadcast whose root differs, and a group of two
# allreduces against one of their joint size (which the device path would fuse into the same
# kernel): both ranks must get an error naming the call's number and both sides within 3 s,
# and their streams must drain. Then the same across two "nodes" (LOOM_NODE_ID): the calls
# cross through pinned host memory, and the host collectives' descriptors must catch the same
# differences ("operation mismatch", both calls named), within the same 3 s. 77 without a GPU.
# Usage: tests/gpu/mismatch.sh [BUILD_DIR]
set -uo pipefail
dir=${1:-${LOOM_BUILD_DIR:-build}}
. "$(dirname "$0")/lib.sh"
gpu_begin mismatch coll share
gpu_run "mismatch gpu_coll mismatch" "$out/mismatch_coll.txt" \
    timeout -k 10 200 "$coll" --only mismatch
gpu_run "mismatch gpu_coll mismatch, across two nodes" "$out/mismatch_coll_nodes.txt" \
    env LOOM_NODE_ID=mm-node-a,mm-node-b timeout -k 10 200 "$coll" --only mismatch
gpu_end
