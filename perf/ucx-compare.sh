#!/usr/bin/env bash
# loom's UCX transport against its references on this machine, interleaved round by round:
#   p2p        one-way bandwidth at SIZE (default 4 MiB): ucx_perftest -t tag_bw, plain and with
#              -e (endpoints with error handling, as loom makes them: UCX 1.13's shared-memory
#              transports have no peer-failure support, so both then leave them out), against
#              loom's p2p_bw (loomSend/loomRecv over LOOM_TRANSPORT=ucx); once with UCX's
#              default transports and once with UCX_TLS=tcp (UCX_TLS as given by the caller,
#              if set, replaces the default run)
#   allreduce  loom-perf over LOOM_TRANSPORT=ucx against LOOM_TRANSPORT=tcp, 8 B to 64 MiB
#
# usage: perf/ucx-compare.sh [-r ROUNDS] [-s SIZE] [-P RANKS] [-b MIN] [-e MAX] [-f FACTOR]
#                            [-n ITERS] [-w WARMUP] [-m MESSAGES] [--build DIR]
#                            [--only p2p|allreduce]
#   -r ROUNDS   rounds (default 5); the tables show medians
#   -s SIZE     p2p message size in bytes (default 4194304)
#   -m MESSAGES p2p messages per run (default 400; loom's in groups of 16)
#   -P RANKS    allreduce ranks, forked locally (default 2)
#   -b/-e/-f    allreduce sizes (default 8, 64M, 8)
#   -n/-w       allreduce timed/warm-up iterations (default 20/5)
#   --build     the build directory (default build)
# Everything runs on loopback (LOOM_SOCKET_IFNAME=lo); each run is bounded by timeout(1).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=5 size=4194304 msgs=400 ranks=2 bmin=8 bmax=64M factor=8 iters=20 warmup=5
build=$root/build only=
while [ $# -gt 0 ]; do
    case $1 in
    -r) rounds=$2; shift 2 ;;
    -s) size=$2; shift 2 ;;
    -m) msgs=$2; shift 2 ;;
    -P) ranks=$2; shift 2 ;;
    -b) bmin=$2; shift 2 ;;
    -e) bmax=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ucx-compare.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
case $rounds in '' | *[!0-9]* | 0) echo "ucx-compare.sh: -r needs a positive number" >&2; exit 2 ;; esac
case $size in '' | *[!0-9]* | 0) echo "ucx-compare.sh: -s needs a size in bytes" >&2; exit 2 ;; esac
case $msgs in '' | *[!0-9]* | 0) echo "ucx-compare.sh: -m needs a positive number" >&2; exit 2 ;; esac
window=16
loom_iters=$(((msgs + window - 1) / window))
export LOOM_SOCKET_IFNAME=lo
tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-ucx-compare.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# ucx_perftest's one-way bandwidth in GB/s (1e9 bytes; it prints MB/s of 2^20 bytes, the
# overall figure of its Final line); $1: extra options (-e).
perftest() {
    command -v ucx_perftest >/dev/null || { echo nan; return; }
    local port=$((20000 + RANDOM % 20000))
    # shellcheck disable=SC2086
    timeout 120 ucx_perftest -p "$port" $1 >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    local mbs
    # shellcheck disable=SC2086
    mbs=$(timeout 120 ucx_perftest 127.0.0.1 -p "$port" $1 -t tag_bw -s "$size" -n "$msgs" -w 20 2>/dev/null |
        awk '/^Final:/ {print $7}')
    wait "$srv" 2>/dev/null || true
    [ -n "$mbs" ] && awk -v m="$mbs" 'BEGIN {printf "%.3f\n", m * 1048576 / 1e9}' || echo nan
}

loom_p2p() {
    local out
    out=$(LOOM_TRANSPORT=ucx timeout 120 "$build/p2p_bw" "$size" "$loom_iters" "$window" 2 2>"$tmp/p2p.err") ||
        { echo "ucx-compare.sh: p2p_bw failed: $(tail -1 "$tmp/p2p.err")" >&2; echo nan; return; }
    echo "$out" | awk '{print $(NF-1)}'
}

if [ -z "$only" ] || [ "$only" = p2p ]; then
    tls_runs=("${UCX_TLS:-default}" tcp)
    for r in $(seq 1 "$rounds"); do
        for tls in "${tls_runs[@]}"; do
            if [ "$tls" = default ]; then unset UCX_TLS; else export UCX_TLS=$tls; fi
            perftest "" >>"$tmp/perftest.$tls"
            perftest -e >>"$tmp/perftest_e.$tls"
            loom_p2p >>"$tmp/loom.$tls"
        done
        echo "ucx-compare.sh: p2p round $r of $rounds done" >&2
    done
    unset UCX_TLS
    echo "# point-to-point, $size bytes, one way, GB/s (median of $rounds interleaved rounds)"
    printf "%-10s %14s %16s %10s %8s %8s\n" UCX_TLS ucx_perftest "ucx_perftest -e" loom-ucx ratio ratio-e
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0) printf "%.2f", b / a; else print "-"}'; }
    for tls in "${tls_runs[@]}"; do
        a=$(median <"$tmp/perftest.$tls") e=$(median <"$tmp/perftest_e.$tls")
        b=$(median <"$tmp/loom.$tls")
        printf "%-10s %14s %16s %10s %8s %8s\n" "$tls" "$a" "$e" "$b" "$(ratio "$a" "$b")" "$(ratio "$e" "$b")"
    done
    echo
fi

if [ -z "$only" ] || [ "$only" = allreduce ]; then
    for r in $(seq 1 "$rounds"); do
        for tp in ucx tcp; do
            LOOM_TRANSPORT=$tp timeout 600 "$build/loom-perf" -P "$ranks" -b "$bmin" -e "$bmax" \
                -f "$factor" -n "$iters" -w "$warmup" --csv "$tmp/ar.$tp.$r.csv" >/dev/null 2>"$tmp/ar.err" ||
                { echo "ucx-compare.sh: loom-perf over $tp failed: $(tail -1 "$tmp/ar.err")" >&2; exit 1; }
        done
        echo "ucx-compare.sh: allreduce round $r of $rounds done" >&2
    done
    # The CSV's columns are named in its first line; take size and the out-of-place time.
    col() { head -1 "$1" | tr ',' '\n' | grep -n -x "$2" | cut -d: -f1 | head -1; }
    first=$(ls "$tmp"/ar.tcp.*.csv | head -1)
    sc=$(col "$first" size) tc=$(col "$first" oop_time_us)
    [ -n "$sc" ] && [ -n "$tc" ] || { echo "ucx-compare.sh: unexpected CSV header: $(head -1 "$first")" >&2; exit 1; }
    echo "# allreduce, $ranks ranks, float sum, out-of-place time per call in us (median of $rounds interleaved rounds)"
    printf "%12s %12s %12s %8s\n" bytes ucx tcp tcp/ucx
    for s in $(tail -n +2 "$first" | cut -d, -f"$sc" | sort -n | uniq); do
        u=$(for f in "$tmp"/ar.ucx.*.csv; do awk -F, -v s="$s" -v c="$sc" -v t="$tc" '$c == s {print $t; exit}' "$f"; done | median)
        t=$(for f in "$tmp"/ar.tcp.*.csv; do awk -F, -v s="$s" -v c="$sc" -v t="$tc" '$c == s {print $t; exit}' "$f"; done | median)
        printf "%12s %12s %12s %8s\n" "$s" "$u" "$t" "$(awk -v u="$u" -v t="$t" 'BEGIN {if (u > 0) printf "%.2f", t / u; else print "-"}')"
    done
fi
