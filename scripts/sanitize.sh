#!/usr/bin/env bash
# The unit and collective suites under AddressSanitizer + UndefinedBehaviorSanitizer (asan) and
# ThreadSanitizer (tsan): builds ROOT/build-asan or ROOT/build-tsan (CUDA off, -O2 -g) and runs a
# bounded selection of cases, each under a timeout. Any sanitizer report fails the run
# (halt_on_error: the process, or the forked rank, exits non-zero).
# Usage: scripts/sanitize.sh asan|tsan|all [ROOT]   (ROOT: where the build dirs go; default: .)
# Prints one line per suite and ends with "sanitize KIND: N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
kinds=${1:-all}
root=${2:-.}
[ "$kinds" = all ] && kinds="asan tsan"

export LOOM_SOCKET_IFNAME=lo
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
# Cases tagged timing are left out: those that assert a speed (strangers: iterations per second
# beside idle connections) or need many processes to start within LOOM_TIMEOUT (128_ranks: 128
# instrumented processes on a small machine do not; jobstate's loom_status: every rank answers the
# service within its 2 s query window); a sanitizer slows every path several times.
export CK_EXCLUDE_TAGS=timing
unset CK_RUN_CASE CK_RUN_SUITE CK_INCLUDE_TAGS

# suite[:case] entries. Forked ranks run under TSan where the suite forks them before anything
# in its process starts a thread (tests/harness.c's h_fork_procs; TSan does not support threads
# started after a multi-threaded fork): thread, secure, determ, jobstate and fusion are clean
# there (fusion's staggered_cuts, which asserts a timing property, is tagged timing), and so are
# recover (its shrink cases, about a minute) and fail (about 3 minutes; its stalled-rank case
# used to start a thread before forking). sched and devplan are pure schedule arithmetic,
# covered by the plain build, and take minutes under a sanitizer.
asan_runs="reduce:conversions reduce:operations-baseline coll:grid coll:big coll:mixed coll:algos
  api fail net progress launch param fork thread recover jobstate secure determ fusion"
tsan_runs="coll:grid coll:big coll:mixed api net progress param fork thread secure determ jobstate
  fusion recover fail"

status=0
for kind in $kinds; do
    case $kind in
    asan) sanitize=address,undefined runs=$asan_runs ;;
    tsan) sanitize=thread runs=$tsan_runs ;;
    *) echo "sanitize.sh: unknown kind '$kind' (asan, tsan or all)" >&2; exit 2 ;;
    esac
    dir=$root/build-$kind
    # gcc's flow warnings are unreliable under instrumentation (false maybe-uninitialized and
    # array-bounds); the plain build keeps -Werror. UCX is left out: its memory hooks (libucm
    # patches mmap/madvise at load) run inside the sanitizers' interceptors and crash the first
    # thread a process starts under ThreadSanitizer, and slow every process's start.
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" -Dwerror=false -Dcuda=disabled -Ducx=disabled \
            -Dbuildtype=debugoptimized \
            -Db_sanitize=$sanitize >/dev/null || { echo "sanitize $kind: 0 passed, 1 failed (setup)"; status=1; continue; }
    fi
    if ! ninja -C "$dir" >"$dir/sanitize-build.log" 2>&1; then
        tail -30 "$dir/sanitize-build.log"
        echo "sanitize $kind: 0 passed, 1 failed (build)"
        status=1
        continue
    fi
    passed=0 failed=0
    for run in $runs; do
        suite=${run%%:*} tcase=
        [ "$suite" != "$run" ] && tcase=${run#*:}
        log=$dir/sanitize-$suite${tcase:+-$tcase}.log
        start=$SECONDS
        env ${tcase:+CK_RUN_CASE=$tcase} CK_DEFAULT_TIMEOUT=300 LOOM_STATUS_BIN="$dir/loom-status" \
            timeout 600 "$dir/tests/test_$suite" \
            >"$log" 2>&1
        rc=$?
        # A case name that matched nothing runs "Checks: 0" and exits 0: a failure here.
        if [ $rc -eq 0 ] && grep -q "Checks: [1-9]" "$log" && ! grep -q "ERROR: AddressSanitizer\|runtime error:\|WARNING: ThreadSanitizer\|ERROR: LeakSanitizer" "$log"; then
            passed=$((passed + 1))
            echo "sanitize $kind: $run ok ($((SECONDS - start)) s)"
        else
            failed=$((failed + 1))
            echo "sanitize $kind: $run FAILED (exit $rc, $((SECONDS - start)) s, log $log)"
            grep -m1 -A30 "ERROR: AddressSanitizer\|runtime error:\|WARNING: ThreadSanitizer\|ERROR: LeakSanitizer\|:F:\|:E:" "$log"
        fi
    done
    echo "sanitize $kind: $passed passed, $failed failed"
    [ $failed -eq 0 ] || status=1
done
exit $status
