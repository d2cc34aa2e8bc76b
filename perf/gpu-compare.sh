#!/usr/bin/env bash
# loom against the machine's NCCL on device buffers, interleaved round by round, medians; or
# one loom build against another (--against), on device or host buffers.
#
# usage: perf/gpu-compare.sh [-r ROUNDS] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]
#                            [-P RANKS] [-d DIR] [-o OUTDIR] [--against DIR_B] [--mem host]
#                            [-- extra loom-perf options]
#   -r  rounds (default 5): each round runs loom then NCCL over the whole sweep
#   -b/-e/-f  sizes (default 8 B to 64 KiB, factor 2)
#   -n/-w timed and warm-up iterations per size (default 1000/100)
#   -P  ranks, one process per GPU (default 2)
#   -d  the loom build directory (default build)
#   -o  where the per-round CSV files go (default $OUT or /tmp/loom-gpu-compare)
#   --against DIR_B  compare with DIR_B/loom-perf (another loom build, the same arguments)
#                    instead of NCCL: the ratio is DIR's time over DIR_B's
#   --mem host|device  the buffers (default device)
# Both libraries run in loom-perf's identical process layout and timing (host clock around
# back-to-back calls, one stream synchronize; results checked bit for bit). A single run on
# this machine moves by 10-20% from one run to the next, for NCCL as for loom, so a
# comparison is only as good as its medians: this prints, per size, the median out-of-place
# time of each over the rounds, the ratio loom/NCCL, and loom's worst round.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=5 min=8 max=64K factor=2 iters=1000 warmup=100 ranks=2 dir=$root/build against= mem=device
out=${OUT:-/tmp/loom-gpu-compare}
while [ $# -gt 0 ]; do
    case $1 in
    -r) rounds=$2; shift 2 ;;
    -b) min=$2; shift 2 ;;
    -e) max=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    -P) ranks=$2; shift 2 ;;
    -d) dir=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    --against) against=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-compare: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
perf=$dir/loom-perf
[ -x "$perf" ] || { echo "gpu-compare: $perf not built" >&2; exit 2; }
other=nccl
if [ -n "$against" ]; then
    [ -x "$against/loom-perf" ] || { echo "gpu-compare: $against/loom-perf not built" >&2; exit 2; }
    other=against
fi
export NCCL_NVLS_ENABLE=0 LOOM_SOCKET_IFNAME=${LOOM_SOCKET_IFNAME:-lo}
mkdir -p "$out"
for ((r = 1; r <= rounds; r++)); do
    for b in loom "$other"; do
        extra=() bin=$perf
        [ "$b" = nccl ] && extra=(--backend nccl)
        [ "$b" = against ] && bin=$against/loom-perf
        if ! "$bin" -P "$ranks" --mem "$mem" -b "$min" -e "$max" -f "$factor" -n "$iters" \
            -w "$warmup" --csv "$out/${b}_$r.csv" "${extra[@]}" "$@" >"$out/${b}_$r.txt" 2>&1; then
            echo "gpu-compare: round $r, $b failed:" >&2
            tail -20 "$out/${b}_$r.txt" >&2
            exit 1
        fi
    done
done
python3 - "$out" "$rounds" "$other" <<'EOF'
import csv, statistics, sys
out, rounds, other = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t = {"loom": {}, other: {}}
for b in t:
    for r in range(1, rounds + 1):
        for row in csv.DictReader(open(f"{out}/{b}_{r}.csv")):
            t[b].setdefault(int(row["size"]), []).append(float(row["oop_time_us"]))
B = "NCCL" if other == "nccl" else "B"
print(f"# {rounds} rounds, out-of-place time per call (us): medians, loom/{B}, loom's worst")
print(f"| size (B) | loom | {B} | loom/{B} | loom worst |")
print("|---:|---:|---:|---:|---:|")
for size in sorted(t["loom"]):
    lm, nm = statistics.median(t["loom"][size]), statistics.median(t[other][size])
    print(f"| {size} | {lm:.2f} | {nm:.2f} | {lm / nm:.2f} | {max(t['loom'][size]):.2f} |")
EOF
