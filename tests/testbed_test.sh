#!/usr/bin/env bash
# meson test 'testbed': the multi-node grid (scripts/testbed.sh grid) with this build's loom-perf;
# further arguments go to the grid (testbed-ucx: --transport ucx --algos "..."; testbed-mpi:
# --transport mpi --mpi-prog PATH).
# Needs root, `ip netns` and `tc`; without them it exits 77, which meson counts as skipped.
set -euo pipefail
perf=${1:?usage: tests/testbed_test.sh PATH/TO/loom-perf [grid arguments]}
shift
skip() {
    echo "SKIP: $*"
    exit 77
}
[[ $(id -u) -eq 0 ]] || skip "the test bed needs root (network namespaces)"
command -v ip >/dev/null 2>&1 || skip "no 'ip' (Debian package iproute2)"
ip netns list >/dev/null 2>&1 || skip "'ip netns' does not work here"
command -v tc >/dev/null 2>&1 || skip "no 'tc' (Debian package iproute2)"
[[ -x $perf ]] || {
    echo "no loom-perf at $perf"
    exit 1
}
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/testbed.sh" grid --perf "$perf" "$@"
