#!/usr/bin/env bash
# loom's fusion against PyTorch DDP's bucketing (gloo, CPU tensors, 25 MB buckets) on one model's
# gradient list, same ranks, in interleaved rounds (the order alternates each round); medians and
# ratios at the end. Needs scripts/bench-deps.sh (python3-torch) and a build (build/).
# Usage: perf/fusion-compare.sh [-P ranks] [-m model] [-r rounds] [-- extra loom-fusion-bench args]
set -euo pipefail
cd "$(dirname "$0")/.."
P=4 M=resnet50 R=5
while [[ $# -gt 0 ]]; do
    case $1 in
    -P) P=$2; shift 2 ;;
    -m) M=$2; shift 2 ;;
    -r) R=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [-P ranks] [-m model] [-r rounds] [-- loom-fusion-bench args]"; exit 2 ;;
    esac
done
bench=${BENCH:-build/loom-fusion-bench}
PY=${PYTHON:-/usr/bin/python3}  # a python with torch (Debian: python3-torch)
[[ -x $bench ]] || { echo "build first: $bench missing"; exit 2; }
"$PY" -c "import torch" 2>/dev/null || { echo "no torch for /usr/bin/python3: run scripts/bench-deps.sh"; exit 2; }
export LOOM_SOCKET_IFNAME=${LOOM_SOCKET_IFNAME:-lo}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run_loom() { "$bench" -P "$P" -m "$M" -n 1 -w 1 "$@" | tee -a "$out/loom.log" | grep '^fusion \|^# horovod' ; }
run_ddp() { "$PY" perf/fusion-ddp.py -P "$P" -m "$M" -n 1 -w 1 | tee -a "$out/ddp.log" | grep '^ddp ' ; }
echo "# fusion-compare: model $M, $P ranks, $R rounds, $(date -u +%FT%TZ), $(nproc) cores"
for r in $(seq 1 "$R"); do
    if (( r % 2 )); then run_loom "$@"; run_ddp; else run_ddp; run_loom "$@"; fi
done
python3 - "$out/loom.log" "$out/ddp.log" <<'PY'
import re, statistics, sys
def fields(path, prefix):
    rows = []
    for line in open(path):
        if line.startswith(prefix):
            rows.append({k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line)})
    return rows
loom = fields(sys.argv[1], "fusion ")
hv = [float(l.split("=")[1]) for l in open(sys.argv[1]) if l.startswith("# horovod_us=")]
ddp = fields(sys.argv[2], "ddp ")
med = lambda rows, k: statistics.median(r[k] for r in rows)
f = med(loom, "fused_us")
print("# medians over %d rounds (us):" % len(loom))
for k in ("per_tensor_us", "fused_us", "tuned_us", "monolithic_us"):
    print("  loom %-14s %12.1f  %6.2fx fused" % (k, med(loom, k), med(loom, k) / f))
print("  loom %-14s %12.1f  %6.2fx fused" % ("horovod_us", statistics.median(hv), statistics.median(hv) / f))
for k in ("ddp_us", "local_us", "comm_us"):
    print("  ddp  %-14s %12.1f  %6.2fx fused" % (k, med(ddp, k), med(ddp, k) / f))
wrong = sum(r["wrong"] for r in loom) + sum(r["wrong"] for r in ddp)
print("compare per_tensor/fused=%.2f fused/monolithic=%.2f tuned/fused=%.2f ddp_comm/fused=%.2f wrong=%d"
      % (med(loom, "per_tensor_us") / f, f / med(loom, "monolithic_us"), med(loom, "tuned_us") / f,
         med(ddp, "comm_us") / f, wrong))
PY
