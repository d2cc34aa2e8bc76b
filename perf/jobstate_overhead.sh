#!/bin/bash
# Per-call cost of the job-state service's bookkeeping: small allreduces (8 B to 1 KiB) on 2 and
# 4 local ranks over loopback, with loom-perf from the build dir given (default: build). Run it
# for two builds (say, before and after a change) and compare the time columns.
#   bash perf/jobstate_overhead.sh [BUILD_DIR] [ITERS]
set -euo pipefail
build=${1:-build}
iters=${2:-5000}
export LOOM_SOCKET_IFNAME=lo
for p in 2 4; do
    echo "# $build: -P $p"
    "$build/loom-perf" -P "$p" -b 8 -e 1K -f 8 -n "$iters" -w 500 -c 0 | grep -E '^ +[0-9]'
done
