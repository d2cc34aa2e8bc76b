#!/usr/bin/env bash
# loom-sim against loom-perf on this machine: for each rank count and forced algorithm, the
# measured time per call (out of place, loom-perf's table) beside loom-sim's prediction for the
# same configuration (--machine dev: one node, shared memory, the host's cores), and their ratio.
#
# Usage: perf/sim-check.sh [-d BUILD] [-P "2 4"] [-a "ring rd rabenseifner tree"]
#                          [-b 8] [-e 8M] [-f 32] [-n 10] [-w 2]
# Prints one markdown table (ranks, algorithm, size, measured us, predicted us, predicted /
# measured). Provisional wherever the machine is shared.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build ranks="2 4" algos="ring rd rabenseifner tree" b=8 e=8M f=32 n=10 w=2
while getopts "d:P:a:b:e:f:n:w:" o; do
    case $o in
    d) build=$OPTARG ;;
    P) ranks=$OPTARG ;;
    a) algos=$OPTARG ;;
    b) b=$OPTARG ;;
    e) e=$OPTARG ;;
    f) f=$OPTARG ;;
    n) n=$OPTARG ;;
    w) w=$OPTARG ;;
    *) exit 2 ;;
    esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| ranks | algorithm | size (B) | measured (us) | loom-sim (us) | sim / measured |"
echo "|---:|---|---:|---:|---:|---:|"
for p in $ranks; do
    for a in $algos; do
        LOOM_ALGO=$a timeout 600 "$build/loom-perf" -P "$p" -b "$b" -e "$e" -f "$f" -n "$n" \
            -w "$w" --csv "$tmp/m.csv" >/dev/null
        "$build/loom-sim" --machine dev --ranks "$p" -b "$b" -e "$e" -f "$f" --algo "$a" \
            --csv "$tmp/s.csv" >/dev/null
        awk -F, -v p="$p" -v a="$a" '
            FNR == 1 { next }
            FILENAME ~ /m.csv$/ { m[$1] = $6; next }
            { s[$4] = $5 }
            END {
                for (k in m) if (k in s) printf "%d %s %d %.2f %.2f %.2f\n", p, a, k, m[k], s[k], s[k] / m[k]
            }' "$tmp/m.csv" "$tmp/s.csv" | sort -k3,3n |
            awk '{ printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6 }'
    done
done
