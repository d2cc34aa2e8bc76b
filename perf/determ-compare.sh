#!/usr/bin/env bash
# The cost of deterministic mode: loom-perf with LOOM_DETERMINISTIC=0 and =1, interleaved round
# by round (slow drift of a noisy machine hits both alike), the median of the rounds per size.
#
# usage: perf/determ-compare.sh [-r ROUNDS] [-P RANKS] [-b MIN] [-e MAX] [-f FACTOR]
#                               [-n ITERS] [-w WARMUP] [-c COLLECTIVE] [-m FILE.md] [-t TIMEOUT_S]
#   -r ROUNDS      runs of each mode (default 5)
#   -P RANKS       local ranks (default 4)
#   -b/-e/-f       sizes, as loom-perf's (default 1K to 64M, factor 4)
#   -n/-w          timed/warmup iterations per size (default 20/5)
#   -c COLLECTIVE  allreduce, reducescatter or reduce (default allreduce)
#   -m FILE        also write the table as markdown to FILE
#   -t TIMEOUT_S   seconds before one run is killed (default 600)
# Other LOOM_* variables in the environment (LOOM_TRANSPORT, LOOM_ALGO...) apply to both modes;
# deterministic mode ignores LOOM_ALGO for reductions. Times are the out-of-place ones of
# loom-perf's --csv (mean per call over the ranks), float sum.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=5 ranks=4 minb=1K maxb=64M factor=4 iters=20 warmup=5 coll=allreduce markdown=
timeout_s=600
loom=${LOOM_PERF:-$root/build/loom-perf}
usage() { sed -n '5,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
    -r) rounds=$2; shift 2 ;;
    -P) ranks=$2; shift 2 ;;
    -b) minb=$2; shift 2 ;;
    -e) maxb=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    -c) coll=$2; shift 2 ;;
    -m) markdown=$2; shift 2 ;;
    -t) timeout_s=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "determ-compare.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
case $rounds in '' | *[!0-9]* | 0) echo "determ-compare.sh: -r needs a positive number" >&2; exit 2 ;; esac
[ -x "$loom" ] || { echo "determ-compare.sh: $loom not built (ninja -C build)" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-determ.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for ((k = 1; k <= rounds; k++)); do
    for mode in 0 1; do
        out=$tmp/m$mode.r$k.csv
        if ! LOOM_DETERMINISTIC=$mode timeout "$timeout_s" "$loom" --collective "$coll" \
            -P "$ranks" -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" \
            --csv "$out" >"$tmp/m$mode.r$k.log" 2>&1; then
            echo "determ-compare.sh: LOOM_DETERMINISTIC=$mode round $k failed:" >&2
            tail -5 "$tmp/m$mode.r$k.log" >&2
            exit 1
        fi
        if awk -F, 'NR > 1 && $9 != 0 { bad = 1 } END { exit !bad }' "$out"; then
            echo "determ-compare.sh: LOOM_DETERMINISTIC=$mode round $k: wrong results" >&2
            exit 1
        fi
    done
    echo "round $k of $rounds done" >&2
done

# size, then the median over rounds of each mode's out-of-place time
table=$(for mode in 0 1; do
    cat "$tmp"/m$mode.r*.csv | awk -F, -v m=$mode 'NR > 0 && $1 ~ /^[0-9]+$/ { print m, $1, $6 }'
done | sort -k1,1n -k2,2n -k3,3g | awk '
    { key = $1 " " $2; v[key, ++n[key]] = $3; if (!(key in seen)) { seen[key] = 1; keys[++nk] = key } }
    END { for (i = 1; i <= nk; i++) { k = keys[i]; c = n[k];
            med = c % 2 ? v[k, (c + 1) / 2] : (v[k, c / 2] + v[k, c / 2 + 1]) / 2;
            split(k, f, " "); print f[1], f[2], med } }' | sort -k2,2n -k1,1n | awk '
    { t[$2, $1] = $3; if (!($2 in s)) { s[$2] = 1; sz[++ns] = $2 } }
    END { for (i = 1; i <= ns; i++) { b = sz[i];
            printf "| %s | %.1f | %.1f | %.2fx |\n", b, t[b, 0], t[b, 1], t[b, 1] / t[b, 0] } }')
head="| bytes | LOOM_DETERMINISTIC=0 (us) | =1 (us) | ratio |
|---:|---:|---:|---:|"
echo "$coll, -P $ranks, float sum, out of place, median of $rounds interleaved rounds"
echo "$head"
echo "$table"
if [ -n "$markdown" ]; then
    { echo "$coll, -P $ranks, float sum, out of place, median of $rounds interleaved rounds"
      echo
      echo "$head"
      echo "$table"; } >"$markdown"
fi
