#!/usr/bin/env bash
# Runs every libFuzzer harness of tests/fuzz for a bounded time over its corpus
# (tests/fuzz/corpus/<target>/, read only: new inputs go to a scratch dir). Builds ROOT/build-fuzz
# with clang (ASan + UBSan, -fsanitize=fuzzer). A crash, a sanitizer report or a timeout fails.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 20)] [ROOT (default .)]
# Prints per target the executions and the corpus size; ends with "fuzz: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
root=${2:-.}
src=$(pwd)
mkdir -p "$root" && dir=$(cd "$root" && pwd)/build-fuzz
if ! command -v clang >/dev/null; then
    echo "fuzz: clang not found (scripts/setup.sh installs it)"
    exit 77
fi
if [ ! -f "$dir/build.ninja" ]; then
    CC=clang meson setup "$dir" -Dfuzz=true -Dcuda=disabled -Dwerror=false \
        -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false \
        -Dc_args=-fsanitize=fuzzer-no-link >"${TMPDIR:-/tmp}/loom-fuzz-setup.log" 2>&1 ||
        { tail -20 "${TMPDIR:-/tmp}/loom-fuzz-setup.log"; echo "fuzz: 0 passed, 1 failed (setup)"; exit 1; }
fi
targets=$(sed -n "s/^fuzz_targets = \[\(.*\)\]/\1/p" tests/fuzz/meson.build | tr -d "',")
if ! ninja -C "$dir" $(for t in $targets; do echo "tests/fuzz/fuzz_$t"; done) >"$dir/fuzz-build.log" 2>&1; then
    tail -30 "$dir/fuzz-build.log"
    echo "fuzz: 0 passed, 1 failed (build)"
    exit 1
fi
export LOOM_SOCKET_IFNAME=lo
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
passed=0 failed=0
for t in $targets; do
    work=$(mktemp -d)
    mkdir -p "tests/fuzz/corpus/$t"
    log=$dir/fuzz-$t.log
    (cd "$work" && timeout $((secs + 60)) "$dir/tests/fuzz/fuzz_$t" -max_total_time="$secs" \
        -timeout=10 -max_len=4096 -print_final_stats=1 "$work" "$src/tests/fuzz/corpus/$t") \
        >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    inputs=$(ls "$work" | wc -l)
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        echo "fuzz: $t ok: ${execs:-?} executions in $secs s, $(ls tests/fuzz/corpus/$t | wc -l) corpus inputs, $inputs new"
    else
        failed=$((failed + 1))
        echo "fuzz: $t FAILED (exit $rc, log $log)"
        grep -m1 -B2 -A30 "ERROR:\|runtime error:\|deadly signal\|Test unit written" "$log"
        cp "$work"/crash-* "$work"/timeout-* "$dir/" 2>/dev/null
    fi
    rm -rf "$work"
done
echo "fuzz: $passed passed, $failed failed"
[ $failed -eq 0 ]
