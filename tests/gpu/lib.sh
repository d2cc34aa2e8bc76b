# shellcheck shell=bash
# Sourced by the GPU checks of tests/gpu (not executable, so scripts/gpu-check.sh does not run it
# on its own). After `dir=${1:-...}` and `. tests/gpu/lib.sh`:
#
#   gpu_begin NAME [coll] [perf] [share]
#       needs $dir/tests/gpu_coll (coll) and $dir/loom-perf (perf), exit 2 when not built; exit 77
#       without a GPU; sets coll, perf, ngpu, out (${OUT:-/tmp}) and fail=0; exports loopback
#       sockets and NVLS off, and with `share` two ranks on GPU 0 (LOOM_CUDA_SHARE_GPU=1, a
#       testing knob: their kernels take turns, so results are checked, not speed)
#   gpu_run [-s last|all|none] [-e ERE [-m N]] LABEL LOG CMD...
#       runs CMD (use `env VAR=...` for settings) with its output in LOG; "ok   LABEL" when it
#       exits 0 and, with -e, LOG has at least N (default 1) lines matching ERE, followed by the
#       log's last line (-s last, the default), all of it (-s all) or nothing (with -e, the
#       count of matching lines follows LABEL); otherwise
#       "FAIL LABEL", the log's FAIL lines and its tail, counted in $fail. Returns 0 or 1.
#   gpu_end
#       "NAME: N failed", and exits 0 when nothing failed.
gpu_begin() {
    gpu_name=$1
    shift
    coll=$dir/tests/gpu_coll perf=$dir/loom-perf
    local need
    for need in "$@"; do
        case $need in
        coll) [ -x "$coll" ] || { echo "$gpu_name: $coll not built"; exit 2; } ;;
        perf) [ -x "$perf" ] || { echo "$gpu_name: $perf not built"; exit 2; } ;;
        share) export LOOM_CUDA_SHARE_GPU=1 CUDA_VISIBLE_DEVICES=0 ;;
        *) echo "gpu_begin: unknown need '$need'"; exit 2 ;;
        esac
    done
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "${ngpu:-0}" -ge 1 ] || { echo "$gpu_name: no GPU: skipped"; exit 77; }
    export LOOM_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
    out=${OUT:-/tmp}
    fail=0
}

gpu_run() {
    local show=last expect='' min=1
    while [ $# -gt 0 ]; do
        case $1 in
        -s) show=$2; shift 2 ;;
        -e) expect=$2; shift 2 ;;
        -m) min=$2; shift 2 ;;
        *) break ;;
        esac
    done
    local label=$1 log=$2 rc seen=0 why=''
    shift 2
    "$@" >"$log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || why="exit $rc"
    if [ -n "$expect" ]; then
        seen=$(grep -cE -- "$expect" "$log" || true)
        if [ "${seen:-0}" -lt "$min" ]; then
            why="${why:+$why, }$seen lines match '$expect' (want $min or more)"
        fi
    fi
    if [ -z "$why" ]; then
        [ -z "$expect" ] || label="$label [$seen matching lines]"
        case $show in
        last) echo "ok   $label: $(tail -1 "$log")" ;;
        all) echo "ok   $label"; cat "$log" ;;
        *) echo "ok   $label" ;;
        esac
        return 0
    fi
    echo "FAIL $label ($why):"
    if grep -qE '^FAIL' "$log"; then
        grep -E '^FAIL' "$log" | head -20
        tail -3 "$log"
    else
        tail -20 "$log"
    fi
    fail=$((fail + 1))
    return 1
}

gpu_end() {
    echo "$gpu_name: $fail failed"
    [ "$fail" -eq 0 ]
    exit
}
