#!/usr/bin/env bash
# PyTorch on loom's NCCL shim, for the GPU machine (2 GPUs, PyTorch with CUDA and NCCL, no
# network needed): the same 2-process job twice, once on NVIDIA's NCCL (plain) and once on loom
# through tools/loom-run, then tests/gpu/torch_shim.py compares the two. See docs/shim.md.
#
#   tests/gpu/torch_shim.sh [BUILD_DIR]      (default: build; the shim is BUILD_DIR/src/shim)
#
# Each run: backend "nccl", CUDA tensors; all_reduce (sum, avg, max, pre-multiplied sum),
# broadcast, reduce, all_gather(_into_tensor), reduce_scatter(_tensor), all_to_all_single,
# send/recv and batched isend/irecv on float32, float16, bfloat16, int32 and int64 of 1, 1000
# and 2^20 elements, every result exact; then 50 steps of DistributedDataParallel training.
# Passes when every result is bit-identical between the runs, the DDP losses agree within
# rtol 1e-5 / atol 1e-6, and the loom run mapped no libnccl.so but the shim and logged the
# shim's "NCCL shim active" line.
#
# Exit: 0 passed, 1 a difference or a failed run (the reasons are printed), 2 bad usage or no
# shim built, 77 skipped (no python3/torch, no CUDA, fewer than 2 GPUs).
# Results and logs go to $OUT/torch_shim when OUT is set, else /tmp/loom-torch-shim.
set -uo pipefail

here=$(cd -P -- "$(dirname -- "$0")" && pwd)
root=$(cd -P -- "$here/../.." && pwd)
[ $# -le 1 ] || {
    echo "usage: $0 [BUILD_DIR]" >&2
    exit 2
}
build=${1:-build}
case $build in
/*) ;;
*) [ -d "$build" ] || build=$root/$build ;;
esac
shim_file=$build/src/shim/libnccl.so.2
if [ ! -f "$shim_file" ]; then
    echo "torch_shim: no shim at $shim_file: build loom first (meson setup $build; ninja -C $build)" >&2
    exit 2
fi
# The exact path loom-run will preload (resolved as it resolves it).
shim=$("$root/tools/loom-run" --lib "$shim_file" --print) || exit 2

command -v python3 >/dev/null 2>&1 || {
    echo "SKIP: no python3 here"
    exit 77
}
py=$here/torch_shim.py
python3 "$py" probe
rc=$?
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || {
    echo "torch_shim: the probe failed (exit $rc)"
    exit 1
}

out=${OUT:+$OUT/torch_shim}
out=${out:-/tmp/loom-torch-shim}
rm -rf "$out/plain" "$out/loom"
mkdir -p "$out/plain" "$out/loom" || exit 1

# Both runs: loopback only, no NVLink SHARP (NCCL_NVLS_ENABLE=0; loom ignores NCCL_*).
export NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo MASTER_ADDR=127.0.0.1
export LOOM_SOCKET_IFNAME=lo CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1
unset LD_PRELOAD LOOM_SHIM_ACTIVE

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# torchrun with TORCH_SHIM_NPROC (default 2) workers on this node, one GPU each; rendezvous at
# 127.0.0.1 (static: no host name needed).
nproc=${TORCH_SHIM_NPROC:-2}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${ngpu:-0}" -lt "$nproc" ]; then
    echo "SKIP: $nproc processes need $nproc GPUs (found ${ngpu:-0})"
    exit 77
fi
torchrun_words() {
    echo python3 -m torch.distributed.run --nnodes=1 --nproc_per_node="$nproc" \
        --master_addr=127.0.0.1 --master_port="$(free_port)"
}

# run NAME LIMIT_S COMMAND...: the output to the terminal and NAME.log; fails on a non-zero
# exit or a timeout.
run() {
    local name=$1 limit=$2
    shift 2
    echo "==== $name run: $* ===="
    timeout --kill-after=30 "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 124 ] && echo "torch_shim: the $name run timed out after $limit s"
        echo "torch_shim: FAILED: the $name run exited with $rc (log: $out/$name.log)"
        return 1
    fi
}

# shellcheck disable=SC2046 # torchrun's words split on purpose (no spaces inside them)
run plain 900 $(torchrun_words) "$py" run --tag plain --out "$out/plain" --forbid-shim "$shim" ||
    exit 1

# On loom: loom-run preloads the shim, which then answers every request for libnccl.so.2. Its
# INFO lines (SHIM and INIT) go to one file per process, which each rank reads back.
# shellcheck disable=SC2046
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=SHIM,INIT LOOM_DEBUG_FILE="$out/loom/loom.%h.%p.log" \
    LOOM_TIMEOUT=300 \
    run loom 900 "$root/tools/loom-run" --lib "$shim" -- \
    $(torchrun_words) "$py" run --tag loom --out "$out/loom" --expect-shim "$shim"
loom_rc=$?
if ! grep -qs "NCCL shim active" "$out"/loom/loom.*.log; then
    echo "torch_shim: no 'NCCL shim active' line in $out/loom/loom.*.log: the loom run did not" \
        "reach the shim"
    loom_rc=1
fi

# Compared even after a failed loom run: what its ranks wrote still shows where it went wrong.
echo "==== compare ===="
python3 "$py" compare --plain "$out/plain" --loom "$out/loom" 2>&1 | tee "$out/compare.txt"
rc=${PIPESTATUS[0]}
if [ "$loom_rc" -ne 0 ]; then
    echo "torch_shim: FAILED: the loom run failed (log: $out/loom.log)"
    exit 1
fi
exit "$rc"
