#!/usr/bin/env bash
# Host allreduce time of several source revisions, interleaved, medians: finds which change made
# the host path slower (run it where cores are idle: the GPU machine's CPUs).
#
#   scripts/rev-pack.sh REV...        # here: git archive of each revision into .base-src/REV.tar.gz
#   perf/rev-compare.sh [-r ROUNDS] [-P K] [-a ALGOS] [-b MIN -e MAX -f F] [-L REV] REV...
#                                     # there (carry .base-src): builds each, then ROUNDS rounds
#
# -L REV runs every revision's loom-perf against the library of REV (LD_LIBRARY_PATH; REV is built
# too): the program's share of a difference, told apart from the library's.
#
# Each revision is built host-only (CUDA off, no tests) in /tmp/rev-REV; the working tree itself
# may be named "." and is built in build-rev. Every round runs every revision once for each
# algorithm in ALGOS (LOOM_ALGO; "auto" leaves it unset) in a fresh order, LOOM_TRANSPORT=shm
# unless set. Prints per size the median out-of-place time of each revision and its ratio to the
# first revision. Writes into $OUT (default /tmp/loom-rev) and /tmp only.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/loom-rev}
rounds=5 ranks=4 algos=ring min=4M max=64M factor=16 libfrom=
while getopts "r:P:a:b:e:f:L:" o; do
    case $o in
    r) rounds=$OPTARG ;;
    P) ranks=$OPTARG ;;
    a) algos=$OPTARG ;;
    b) min=$OPTARG ;;
    e) max=$OPTARG ;;
    f) factor=$OPTARG ;;
    L) libfrom=$OPTARG ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: perf/rev-compare.sh [-r N] [-P K] [-a ALGOS] REV..." >&2; exit 2; }
mkdir -p "$out"
export LOOM_SOCKET_IFNAME=lo LOOM_TRANSPORT=${LOOM_TRANSPORT:-shm}
. "$root/scripts/carried-deps.sh"
declare -A bin
for rev in "$@" ${libfrom:+"$libfrom"}; do
    [ -n "${bin[$rev]:-}" ] && continue
    if [ "$rev" = . ]; then
        src=$root dir=$root/build-rev
    else
        tarball=$root/.base-src/$rev.tar.gz
        [ -f "$tarball" ] || { echo "no $tarball: run scripts/rev-pack.sh $rev first" >&2; exit 1; }
        src=/tmp/rev-$rev dir=/tmp/rev-$rev/b
        rm -rf "$src" && mkdir -p "$src" && tar -xzf "$tarball" -C "$src"
    fi
    (cd "$src" && { [ -d "$dir" ] || meson setup "$dir" -Dcuda=disabled -Dtests=false \
        --buildtype=release >/dev/null; } && ninja -C "$dir" loom-perf) \
        >"$out/build-${rev//\//_}.txt" 2>&1 || { tail -20 "$out/build-${rev//\//_}.txt"; exit 1; }
    bin[$rev]=$dir/loom-perf
done
raw=$out/raw.txt
: >"$raw"
for ((r = 0; r < rounds; r++)); do
    for algo in ${algos//,/ }; do
        for rev in $(printf '%s\n' "$@" | shuf); do
            env_algo=()
            [ "$algo" = auto ] || env_algo=(LOOM_ALGO=$algo)
            [ -n "$libfrom" ] && env_algo+=(LD_LIBRARY_PATH=$(dirname "${bin[$libfrom]}"))
            env "${env_algo[@]}" timeout 120 "${bin[$rev]}" -P "$ranks" -b "$min" -e "$max" \
                -f "$factor" -n 20 -w 5 -c 0 2>&1 | awk -v rev="$rev" -v algo="$algo" \
                '$1 ~ /^[0-9]+$/ && NF >= 8 { print rev, algo, $1, $6 }' >>"$raw"
        done
    done
done
# median per (algo, size, rev), ratio to the first revision named
awk -v first="$1" -v order="$*" '
    { key = $2 " " $3 " " $1; v[key, ++n[key]] = $4; sizes[$2 " " $3] = 1 }
    function median(k,   i, j, t, m, a) {
        m = n[k]
        for (i = 1; i <= m; i++) a[i] = v[k, i]
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    }
    END {
        nr = split(order, revs, " ")
        printf "%-8s %12s", "algo", "bytes"
        for (i = 1; i <= nr; i++) printf " %14s", substr(revs[i], 1, 14)
        printf "   (median us over rounds; ratio to %s)\n", first
        for (s in sizes) {
            split(s, p, " ")
            base = median(s " " first)
            printf "%-8s %12s", p[1], p[2]
            for (i = 1; i <= nr; i++) {
                k = s " " revs[i]
                if (!(k in n)) { printf " %14s", "-"; continue }
                m = median(k)
                printf " %8.0f %5.2f", m, (base > 0 ? m / base : 0)
            }
            printf "\n"
        }
    }' "$raw" | sort -k1,1 -k2,2n | tee "$out/summary.txt"
