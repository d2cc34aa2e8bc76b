#!/usr/bin/env bash
# Whether the placement of a rank's buffers changes an allreduce's time (perf/probes/layout.c):
# each layout (send and receive offsets from a 2 MiB boundary, with and without transparent huge
# pages, or after a first one-double call) runs in turn, ROUNDS times in a fresh order, and the medians are printed side by side.
#   perf/layout.sh [BUILD_DIR] [ROUNDS] [SIZES]     (default build, 3, "4194304 67108864")
# LOOM_TRANSPORT (default shm), LOOM_ALGO (default ring) and LAYOUT_P (default 4) pass through.
set -uo pipefail
b=${1:-build} rounds=${2:-3} sizes=${3:-4194304 67108864}
export LOOM_SOCKET_IFNAME=lo LOOM_TRANSPORT=${LOOM_TRANSPORT:-shm} LOOM_ALGO=${LOOM_ALGO:-ring}
layouts=("0 0" "16 16" "0 2048" "64 2112" "0 0 -H" "16 16 -H" "0 0 -f")
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for ((r = 0; r < rounds; r++)); do
    for size in $sizes; do
        for i in $(seq 0 $((${#layouts[@]} - 1)) | shuf); do
            set -- ${layouts[$i]}
            "$b/layout" -P "${LAYOUT_P:-4}" -s "$size" -o "$1" -O "$2" ${3:-} -r 3 |
                sed "s/^/$i /" >>"$raw"
        done
    done
done
# "i layout P ranks SIZE B send+S recv+R [thp] [first-small]: T us ..." -> median T per layout
awk '{ key = $5; for (f = 7; f <= NF && $f != "us"; f++) if ($(f + 1) != "us") key = key " " $f
       sub(":", "", key)
       for (f = 1; f <= NF; f++) if ($(f + 1) == "us") { v[key, ++n[key]] = $f; break } }
     END { for (k in n) { m = n[k]; for (i = 1; i <= m; i++) a[i] = v[k, i]
             for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
             printf "%s: %.1f us (median of %d)\n", k, a[int((m + 1) / 2)], m } }' "$raw" | sort -n
