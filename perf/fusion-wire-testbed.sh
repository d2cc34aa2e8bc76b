#!/usr/bin/env bash
# Fusion's exact wire against the 16-bit (bf16) wire on the multi-node test bed
# (scripts/testbed.sh: network namespaces, tbf-shaped veth links): one model's gradient list
# through loom-fusion-bench, modes fused and fused_bf16, in R rounds (one warm-up and one timed
# step of each mode per round, each round a fresh job); medians, the ratio, and where the
# compressed buckets' time went (rank 0's encode/reduce/decode seconds per step).
# Usage: perf/fusion-wire-testbed.sh [-m model] [-r rounds] [--rate R] [--layout "2 2"]
#                                    [-- extra loom-fusion-bench args]
# Needs root and ip/tc (else the test bed's skip, exit 77); builds nothing: build/ first.
# LOOM_* variables (say LOOM_FUSION_WIRE_PIECE) reach the ranks. The bed is taken down on exit.
# TESTBED=path: another copy of scripts/testbed.sh (its own names and subnet, for a second bed).
set -euo pipefail
cd "$(dirname "$0")/.."
M=bert-base R=3 RATE=1gbit LAYOUT="2 2"
while [[ $# -gt 0 ]]; do
    case $1 in
    -m) M=$2; shift 2 ;;
    -r) R=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --layout) LAYOUT=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [-m model] [-r rounds] [--rate R] [--layout \"2 2\"] [-- bench args]"
       exit 2 ;;
    esac
done
bench=${BENCH:-build/loom-fusion-bench}
tb=${TESTBED:-scripts/testbed.sh}
[[ -x $bench ]] || { echo "build first: $bench missing"; exit 2; }
read -ra nodes <<<"$LAYOUT"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The bed is one per machine: `up` refuses when one exists (someone else's run), and only a bed
# this script brought up is taken down.
rc=0
"$tb" up "${#nodes[@]}" --rate "$RATE" || rc=$?
((rc == 0)) || exit "$rc"
trap '"$tb" down >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
echo "# fusion-wire-testbed: model $M, layout \"$LAYOUT\", links $RATE, $R rounds," \
    "$(date -u +%FT%TZ), $(nproc) cores, LOOM_FUSION_WIRE_PIECE=${LOOM_FUSION_WIRE_PIECE:-default}"
for r in $(seq 1 "$R"); do
    "$tb" run "$LAYOUT" --timeout 600 -- "$bench" -m "$M" -n 1 -w 1 \
        --modes fused,fused_bf16 "$@" | tee -a "$out/log" | grep '^fusion \|^# fused_bf16'
done
python3 - "$out/log" <<'PY'
import re, statistics, sys
rows = {"fused": [], "bf16": [], "wall": [], "enc": [], "red": [], "dec": [], "err": []}
for line in open(sys.argv[1]):
    if line.startswith("fusion "):
        rows["fused"].append(float(re.search(r"fused_us=([0-9.]+)", line).group(1)))
    elif line.startswith("# fused_bf16_us="):
        rows["bf16"].append(float(re.search(r"fused_bf16_us=([0-9.]+)", line).group(1)))
        rows["err"].append(float(re.search(r"max_rel_error=([0-9.e+-]+)", line).group(1)))
    elif line.startswith("# fused_bf16 per step:"):
        m = re.search(r"wall ([0-9.]+) us, encode ([0-9.]+) us, reduce ([0-9.]+) us, "
                      r"decode ([0-9.]+) us", line)
        for k, v in zip(("wall", "enc", "red", "dec"), m.groups()):
            rows[k].append(float(v))
med = {k: statistics.median(v) for k, v in rows.items() if v}
if "fused" not in med or "bf16" not in med:
    sys.exit("no results")
print(f"| exact (fused) | {med['fused'] / 1e3:.0f} ms |")
print(f"| bf16 wire (fused_bf16) | {med['bf16'] / 1e3:.0f} ms |")
print(f"exact / bf16 = {med['fused'] / med['bf16']:.2f}x (medians of {len(rows['bf16'])}),"
      f" max relative error reported {max(rows['err']):.3g}")
if "wall" in med:
    print(f"bf16 buckets per step (rank 0, ms): wall {med['wall'] / 1e3:.0f}, encode "
          f"{med['enc'] / 1e3:.0f}, reduce {med['red'] / 1e3:.0f}, decode {med['dec'] / 1e3:.0f}")
PY
