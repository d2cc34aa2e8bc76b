#!/usr/bin/env bash
# Reduce and broadcast: LOOM_ALGO=ring, =tree and the automatic choice (unset), interleaved
# round by round (every configuration once per size per round, so that a contended machine's
# drift touches them alike), one checked loom-perf run per point (exact inputs, bit for bit).
# Prints per collective a table of median out-of-place and in-place times (us) over the rounds,
# and writes every run to OUT/rooted.csv.
#
#   perf/rooted-compare.sh [-P 4] [-r 3] [-n 20] [-w 3] [--root 0] [-o OUT]
#                          [--sizes "8 512 32K 256K 2M 16M 64M"] [--loom build/loom-perf]
set -euo pipefail
cd "$(dirname "$0")/.."
P=4 R=3 N=20 W=3 ROOT=0 OUT=rooted-out LOOM=build/loom-perf
SIZES="8 512 32K 256K 2M 16M 64M"
while [ $# -gt 0 ]; do
    case "$1" in
    -P) P=$2 ;;
    -r) R=$2 ;;
    -n) N=$2 ;;
    -w) W=$2 ;;
    --root) ROOT=$2 ;;
    -o) OUT=$2 ;;
    --sizes) SIZES=$2 ;;
    --loom) LOOM=$2 ;;
    *) echo "rooted-compare: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
[ -x "$LOOM" ] || { echo "rooted-compare: $LOOM not built (ninja -C build)" >&2; exit 1; }
mkdir -p "$OUT"
csv=$OUT/rooted.csv
echo "collective,algo,round,bytes,oop_us,ip_us,wrong" >"$csv"
export LOOM_SOCKET_IFNAME=${LOOM_SOCKET_IFNAME:-lo}
for r in $(seq 1 "$R"); do
    for s in $SIZES; do
        for c in reduce broadcast; do
            for a in ring tree auto; do
                if [ "$a" = auto ]; then env=(env -u LOOM_ALGO); else env=(env LOOM_ALGO=$a); fi
                line=$("${env[@]}" timeout 300 "$LOOM" --collective "$c" -P "$P" -b "$s" -e "$s" \
                    -n "$N" -w "$W" -r "$ROOT" | awk '$1 ~ /^[0-9]+$/ {print $1","$6","$10","$9+$13}' \
                    | head -1) || { echo "rooted-compare: $c $a $s failed" >&2; exit 1; }
                b=${line%%,*}
                rest=${line#*,}
                oop=${rest%%,*}
                rest=${rest#*,}
                ip=${rest%%,*}
                wrong=${rest#*,}
                echo "$c,$a,$r,$b,$oop,$ip,$wrong" >>"$csv"
                [ "$wrong" = 0 ] || { echo "rooted-compare: $c $a $s: $wrong wrong" >&2; exit 1; }
            done
        done
    done
done
/usr/bin/python3 - "$csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for c in ("reduce", "broadcast"):
    sizes = sorted({int(x["bytes"]) for x in rows if x["collective"] == c})
    print(f"\n{c}: median time in us over the rounds, out of place / in place")
    print("| bytes | ring | tree | auto |")
    print("|---|---|---|---|")
    for s in sizes:
        cells = []
        for a in ("ring", "tree", "auto"):
            pts = [x for x in rows if x["collective"] == c and x["algo"] == a and int(x["bytes"]) == s]
            o = statistics.median(float(x["oop_us"]) for x in pts)
            i = statistics.median(float(x["ip_us"]) for x in pts)
            cells.append(f"{o:.1f} / {i:.1f}")
        print(f"| {s} | " + " | ".join(cells) + " |")
PY
