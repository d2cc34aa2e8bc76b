#!/usr/bin/env bash
# The whole GPU check in one command, for the GPU machine (Ubuntu + CUDA, maybe no packages):
#
#   scripts/gpu-check.sh [--prebuilt DIR] [--perf]
#
#   --prebuilt DIR  use DIR, a meson build directory built elsewhere (with CUDA) and carried over,
#                   instead of building; otherwise build-gpu/ is built here with meson + ninja
#   --perf          also run loom-perf on device buffers, loom then NCCL (perf_*.txt)
#
# A machine without libsodium's development files (the GPU machine has no package access):
# run scripts/gpu-deps.sh where the tree comes from and carry .gpu-deps with it.
#
# (tests/gpu/windows.sh is the registered windows' check: two ranks on one GPU, gpu_coll's "win"
# group and loom-perf -R 2; on a machine of one GPU gpu_coll itself skips that group.
# tests/gpu/graphs.sh is the CUDA graphs' check, the same way: gpu_coll's "graphs" group and
# loom-perf -G.)
#
# Prints the GPUs and their topology, then runs, each with its output tee'd into $OUT/<name>.txt
# ($OUT defaults to /tmp/loom-gpu): DIR/tests/gpu_guard, DIR/tests/gpu_coll, and every executable
# tests/gpu/*.sh (called with DIR as $1; LOOM_BUILD_DIR and OUT are exported as well). Exit 77
# counts as skipped. Ends with "N passed, N failed, N skipped"; exits 1 if anything failed.
# Never touches clocks or resets, and keeps NVLink multicast (NVLS) off.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
export PATH=/usr/local/cuda/bin:$PATH
export NCCL_NVLS_ENABLE=0
export LOOM_SOCKET_IFNAME=${LOOM_SOCKET_IFNAME:-lo}
out=${OUT:-/tmp/loom-gpu}
export OUT=$out

die() {
    echo "gpu-check: $*" >&2
    exit 1
}

prebuilt='' perf=0
while [ $# -gt 0 ]; do
    case $1 in
    --prebuilt)
        [ $# -ge 2 ] || die "--prebuilt needs a directory"
        prebuilt=$2
        shift 2
        ;;
    --prebuilt=*)
        prebuilt=${1#--prebuilt=}
        shift
        ;;
    --perf)
        perf=1
        shift
        ;;
    -h | --help)
        sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument '$1' (usage: scripts/gpu-check.sh [--prebuilt DIR] [--perf])" ;;
    esac
done
mkdir -p "$out" || die "cannot create $out"

# ---- the build -----------------------------------------------------------------------------
# Libraries this machine lacks, carried as Debian packages (scripts/carried-deps.sh).
. "$root/scripts/carried-deps.sh"
if [ -n "$prebuilt" ]; then
    [ -d "$prebuilt" ] || die "--prebuilt $prebuilt: no such directory"
    dir=$(cd "$prebuilt" && pwd)
    [ -f "$dir/libloom.so" ] || [ -f "$dir/libloom.so.0" ] ||
        die "--prebuilt $dir: no libloom.so there (not a built loom meson build directory?)"
    echo "gpu-check: using the prebuilt $dir"
elif command -v meson >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
    dir=$root/build-gpu
    if [ ! -f "$dir/build.ninja" ]; then
        # -Dtests=false: the Check suites are not needed here (and Check may be absent); the GPU
        # tests are built regardless.
        meson setup "$dir" -Dcuda=enabled -Dtests=false 2>&1 | tee "$out/build.txt" ||
            die "meson setup $dir failed (see $out/build.txt)"
        [ -f "$dir/build.ninja" ] || die "meson setup $dir failed (see $out/build.txt)"
    fi
    ninja -C "$dir" 2>&1 | tee -a "$out/build.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || die "ninja -C $dir failed (see $out/build.txt)"
else
    die "no build: pass --prebuilt DIR (a meson build directory built with CUDA elsewhere), or" \
        "install meson and ninja here (neither is on PATH)"
fi

# ---- the machine ---------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>&1 | tee "$out/gpus.txt"
    nvidia-smi topo -m 2>&1 | tee "$out/topo.txt"
else
    echo "gpu-check: nvidia-smi not found" | tee "$out/gpus.txt"
fi

# ---- the tests -----------------------------------------------------------------------------
pass=0 fail=0 skip=0
# run NAME LIMIT_S COMMAND...: output to the terminal and $out/NAME.txt; 77 = skipped.
run() {
    local name=$1 limit=$2 rc
    shift 2
    echo "=== $name: $*"
    if command -v timeout >/dev/null 2>&1; then
        timeout -k 30 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    else
        "$@" 2>&1 | tee "$out/$name.txt"
    fi
    rc=${PIPESTATUS[0]}
    case $rc in
    0)
        pass=$((pass + 1))
        echo "=== $name: PASS"
        ;;
    77)
        skip=$((skip + 1))
        echo "=== $name: SKIPPED"
        ;;
    124 | 137)
        fail=$((fail + 1))
        echo "=== $name: FAIL (timed out after $limit s)" | tee -a "$out/$name.txt"
        ;;
    *)
        fail=$((fail + 1))
        echo "=== $name: FAIL (exit $rc)"
        ;;
    esac
}

# missing NAME WHY: a test that should be there and is not.
missing() {
    echo "=== $1: FAIL ($2)" | tee "$out/$1.txt"
    fail=$((fail + 1))
}

export LOOM_BUILD_DIR=$dir
if [ -x "$dir/tests/gpu_guard" ]; then
    run gpu_guard 120 "$dir/tests/gpu_guard"
else
    missing gpu_guard "$dir/tests/gpu_guard was not built"
fi
if [ -x "$dir/tests/gpu_coll" ]; then
    run gpu_coll 600 "$dir/tests/gpu_coll"
else
    missing gpu_coll "$dir/tests/gpu_coll was not built (was $dir configured without CUDA?)"
fi
for script in tests/gpu/*.sh; do
    if [ ! -f "$script" ] || [ ! -x "$script" ]; then continue; fi
    run "$(basename "$script" .sh)" 600 "$script" "$dir"
done

if [ "$perf" -eq 1 ]; then
    if [ -x "$dir/loom-perf" ]; then
        run perf_loom 900 "$dir/loom-perf" -P 2 --mem device -b 8 -e 8G -f 2
        run perf_nccl 900 "$dir/loom-perf" -P 2 --mem device -b 8 -e 8G -f 2 --backend nccl
    else
        missing perf_loom "$dir/loom-perf was not built"
    fi
fi

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
