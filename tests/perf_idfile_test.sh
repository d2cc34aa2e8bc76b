#!/usr/bin/env bash
# meson test 'perf-idfile': loom-perf launched as two ranks (LOOM_RANK, LOOM_WORLD_SIZE,
# LOOM_ID_FILE) must leave the id file, which holds the job's secret, readable by its owner only.
set -euo pipefail
perf=${1:?usage: tests/perf_idfile_test.sh PATH/TO/loom-perf}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
id=$dir/loom.id
# A permissive umask: the file's mode must not depend on the caller's.
umask 022
export LOOM_WORLD_SIZE=2 LOOM_ID_FILE=$id LOOM_SOCKET_IFNAME=lo LOOM_TIMEOUT=20
LOOM_RANK=0 timeout 60 "$perf" -b 8 -e 8 -n 1 -w 0 >"$dir/r0.log" 2>&1 &
p0=$!
LOOM_RANK=1 timeout 60 "$perf" -b 8 -e 8 -n 1 -w 0 >"$dir/r1.log" 2>&1 &
p1=$!
rc=0
wait "$p0" || rc=1
wait "$p1" || rc=1
if [[ $rc -ne 0 ]]; then
    echo "loom-perf failed:"
    cat "$dir/r0.log" "$dir/r1.log"
    exit 1
fi
mode=$(stat -c %a "$id")
if [[ $mode != 600 ]]; then
    echo "the id file $id has mode $mode, expected 600 (it holds the job secret)"
    exit 1
fi
echo "id file mode $mode"
