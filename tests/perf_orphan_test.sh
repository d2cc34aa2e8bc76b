#!/usr/bin/env bash
# meson test 'perf-orphans': the ranks loom-perf forks under -P die with it. A long run is
# killed with SIGKILL (no handler can run); its ranks must be gone within 2 s.
set -euo pipefail
perf=${1:?usage: tests/perf_orphan_test.sh PATH/TO/loom-perf}
dir=$(mktemp -d)
ranks=""
cleanup() {
    [[ -n $ranks ]] && kill -9 $ranks 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
export LOOM_SOCKET_IFNAME=lo LOOM_TIMEOUT=30
timeout 120 "$perf" -P 2 -b 1M -e 1M -n 1000000 -w 0 -c 0 >"$dir/perf.log" 2>&1 &
parent=$!
# timeout runs loom-perf as its child: find loom-perf, then its two ranks.
for _ in $(seq 100); do
    perfpid=$(pgrep -P "$parent" || true)
    [[ -n $perfpid ]] && ranks=$(pgrep -P "$perfpid" | tr '\n' ' ' || true)
    [[ $(wc -w <<<"$ranks") -ge 2 ]] && break
    sleep 0.1
done
if [[ $(wc -w <<<"$ranks") -lt 2 ]]; then
    echo "loom-perf did not start its two ranks:"
    cat "$dir/perf.log"
    exit 1
fi
sleep 0.5
kill -9 "$perfpid"
for _ in $(seq 20); do
    alive=""
    # A dead rank nobody has reaped yet is a zombie ('Z'): gone for this test.
    for p in $ranks; do
        st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || true)
        [[ -n $st && $st != Z ]] && alive+="$p "
    done
    [[ -z $alive ]] && { echo "ranks gone after loom-perf was killed"; exit 0; }
    sleep 0.1
done
echo "ranks $alive of killed loom-perf $perfpid still run 2 s later"
exit 1
