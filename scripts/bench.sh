#!/usr/bin/env bash
# The main job: set up, build, and run loom-perf's allreduce on 4 local ranks over loopback TCP,
# 8 B to 64 MiB, with its correctness check (exact inputs, #wrong must be 0).
# Extra arguments go to loom-perf (e.g. -d all -o all).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
exec build/loom-perf -P 4 -b 8 -e 64M -f 4 -n 10 -w 3 -c 1 "$@"
