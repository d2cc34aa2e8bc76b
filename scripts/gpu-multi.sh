#!/usr/bin/env bash
# The many-GPU run (issue 6) in one command, for a machine with 4 or 8 GPUs of one host:
#   1. loom's GPU test suite on every GPU (tests/gpu/gpu_coll: one process per GPU);
#   2. loom-perf against the machine's NCCL, allreduce 8 B .. 8 GiB, float32 and bfloat16, one
#      process per GPU for both (NCCL_NVLS_ENABLE=0: NCCL on its ring and tree algorithms);
#   3. the same GPUs told they are two nodes of half the GPUs each (LOOM_NODE_ID), so the
#      hierarchical device path and its host staging run, up to 1 GiB, checked;
#   4. unmodified PyTorch DDP on the NCCL shim with one process per GPU, against NCCL.
# Results land in $OUT (or /tmp/loom-multi) as they are made, one file per step.
#   scripts/gpu-multi.sh [--prebuilt DIR] [--quick]      (--quick: smaller sweeps, a dry run)
set -uo pipefail
cd "$(dirname "$0")/.."
dir=build quick=0
while [ $# -gt 0 ]; do
    case $1 in
    --prebuilt) dir=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "usage: scripts/gpu-multi.sh [--prebuilt DIR] [--quick]" >&2; exit 2 ;;
    esac
done
out=${OUT:-/tmp/loom-multi}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 LOOM_SOCKET_IFNAME=lo
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${n:-0}" -ge 2 ] || { echo "gpu-multi: needs at least 2 GPUs (found ${n:-0})"; exit 77; }
[ -x "$dir/loom-perf" ] || { echo "gpu-multi: $dir/loom-perf not built"; exit 2; }
nvidia-smi -L | tee "$out/gpus.txt"
nvidia-smi topo -m > "$out/topo.txt" 2>&1
big=8G half=$((n / 2)) staged_max=1G
[ "$quick" -eq 1 ] && big=256M staged_max=64M
pass=0 fail=0
step() { # NAME LIMIT COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*"
    timeout -k 20 "$limit" "$@" > "$out/$name.txt" 2>&1
    local rc=$?
    tail -4 "$out/$name.txt"
    if [ "$rc" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "=== $name: FAIL ($rc)"; fi
}
step coll 400 "$dir/tests/gpu_coll" --skip big
for t in float bfloat16; do
    step "perf_loom_$t" 300 "$dir/loom-perf" -P "$n" --mem device -d "$t" -b 8 -e "$big" -f 2
    step "perf_nccl_$t" 300 "$dir/loom-perf" -P "$n" --backend nccl -d "$t" -b 8 -e "$big" -f 2
done
ids=$(for i in $(seq 0 $((n - 1))); do [ "$i" -lt "$half" ] && printf 'node-a,' || printf 'node-b,'; done)
ids=${ids%,}
step staged_allreduce 300 env LOOM_NODE_ID="$ids" "$dir/loom-perf" -P "$n" --mem device \
    -b 8 -e "$staged_max" -f 4 -c 1
for c in allgather reducescatter broadcast; do
    step "staged_$c" 200 env LOOM_NODE_ID="$ids" "$dir/loom-perf" -P "$n" --mem device --collective "$c" \
        -b 8 -e 64M -f 16 -c 1
done
step torch_ddp 600 env TORCH_SHIM_NPROC="$n" tests/gpu/torch_shim.sh "$dir"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
