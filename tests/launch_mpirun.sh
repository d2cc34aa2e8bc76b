#!/usr/bin/env bash
# Jobs started by Open MPI's mpirun: loom's ranks found from its variables and met through its
# PMIx server, or at MASTER_ADDR:MASTER_PORT. Usage: launch_mpirun.sh LAUNCH_PROG LOOM_PERF
# [LAUNCH_PROG_MPI]; LOOM_TEST_PMIX=0 says that loom was built without PMIx (the PMIx runs then
# check the error that says so, or with LOOM_TEST_MPI=1 that loom meets over MPI instead). Exits 77 (skipped) without mpirun. Everything stays on loopback and is bounded by timeout.
set -u
prog=$1 perf=$2 prog_mpi=${3:-}
command -v mpirun >/dev/null || { echo "launch_mpirun: no mpirun: skipped"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LOOM_SOCKET_IFNAME=lo
export LOOM_TIMEOUT=20
unset LOOM_JOB_SECRET MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOOM_RANK LOOM_WORLD_SIZE
mpi=(mpirun --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo
     --mca oob_tcp_if_include lo -x LOOM_SOCKET_IFNAME -x LOOM_TIMEOUT)
out=$(mktemp) fails=0
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; sed 's/^/    /' "$out"; fails=$((fails + 1)); }

# run NAME EXPECT_RC CMD...: the command's output lands in $out
run() {
    local name=$1 want=$2; shift 2
    timeout -k 5 90 "$@" >"$out" 2>&1
    local rc=$?
    if [ "$want" = 0 ] && [ $rc -ne 0 ]; then fail "$name: exit $rc"; return 1; fi
    if [ "$want" != 0 ] && [ $rc -eq 0 ]; then fail "$name: exit 0, expected a failure"; return 1; fi
    echo "ok: $name"
}

if [ "${LOOM_TEST_PMIX:-1}" = 0 ] && [ "${LOOM_TEST_MPI:-0}" = 1 ]; then
    # without PMIx in loom but with MPI, loom starts MPI (which finds mpirun's server) and meets
    # over MPI_COMM_WORLD
    if run "launch_prog under mpirun -np 2, a build without PMIx but with MPI" 0 \
            "${mpi[@]}" -np 2 "$prog"; then
        n=$(grep -c "launch_prog: rank [0-1] of 2 ok" "$out")
        [ "$n" = 2 ] || fail "no PMIx, MPI: $n of 2 ranks said ok"
    fi
    prog_mpi=""
elif [ "${LOOM_TEST_PMIX:-1}" = 0 ]; then
    if run "launch_prog under mpirun -np 2, a build without PMIx" 1 "${mpi[@]}" -np 2 "$prog"; then
        grep -q "this build of loom has no PMIx" "$out" || fail "no PMIx: the error does not say so"
    fi
    prog_mpi=""
fi

# MASTER_ADDR/MASTER_PORT beside Open MPI's variables: the way without PMIx (with PMIx loom
# prefers the server, which carries the secret too).
# A port below the ephemeral range that nothing listens on (bash's /dev/tcp connect fails).
port=0
for ((try = 0; try < 200; try++)); do
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
if run "launch_prog under mpirun -np 3 with MASTER_ADDR/MASTER_PORT" 0 "${mpi[@]}" -np 3 \
        -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" -x LOOM_JOB_SECRET=launch-test "$prog"; then
    n=$(grep -c "launch_prog: rank [0-2] of 3 ok" "$out")
    [ "$n" = 3 ] || fail "launch_prog (MASTER_ADDR): $n of 3 ranks said ok"
fi

if [ "${LOOM_TEST_PMIX:-1}" = 0 ]; then
    [ $fails -eq 0 ] && echo "launch_mpirun: all passed (no PMIx in this build)"
    exit $((fails > 0))
fi

if run "launch_prog under mpirun -np 4" 0 "${mpi[@]}" -np 4 "$prog"; then
    n=$(grep -c "launch_prog: rank [0-3] of 4 ok" "$out")
    [ "$n" = 4 ] || fail "launch_prog: $n of 4 ranks said ok"
fi

if [ -n "$prog_mpi" ] && run "launch_prog with MPI_Init under mpirun -np 3" 0 \
        "${mpi[@]}" -np 3 "$prog_mpi"; then
    n=$(grep -c "launch_prog: rank [0-2] of 3 ok" "$out")
    [ "$n" = 3 ] || fail "launch_prog (MPI): $n of 3 ranks said ok"
fi

if [ -n "$prog_mpi" ] && run "launch_prog with a late MPI_Init under mpirun -np 3" 0 \
        "${mpi[@]}" -np 3 -x LAUNCH_PROG_MPI_LATE=1 "$prog_mpi"; then
    n=$(grep -c "launch_prog: rank [0-2] of 3 ok" "$out")
    [ "$n" = 3 ] || fail "launch_prog (late MPI): $n of 3 ranks said ok"
fi

# perf_ok NAME: $out holds one loom-perf table of 4 ranks, 8 B to 64 KiB by 4, nothing wrong
perf_ok() {
    grep -q "^# Collective test starting: .* (allreduce, 4 ranks)" "$out" ||
        fail "$1: no table headed 4 ranks"
    [ "$(grep -c '^# loom-perf' "$out")" = 1 ] || fail "$1: more than one table"
    rows=$(grep -cE '^ +[0-9]+ ' "$out")
    [ "$rows" = 7 ] || fail "$1: $rows rows, expected 7 (8 B to 64 KiB by 4)"
    # #wrong is the 9th and the 13th column of each row
    awk '/^ +[0-9]+ / && ($9 != 0 || $13 != 0) { bad = 1 } END { exit bad }' "$out" ||
        fail "$1: #wrong not 0"
}
if run "loom-perf under mpirun -np 4" 0 "${mpi[@]}" -np 4 "$perf" -b 8 -e 64K -f 4 -n 3 -w 1 -c 1
then
    perf_ok loom-perf
fi
# The transports a cluster job picks by name, under the launcher: UCX (its worker addresses
# travel through the bootstrap) and MPI (loom starts MPI, which finds mpirun's PMIx server).
for t in ${LOOM_TEST_TRANSPORTS:-}; do
    if run "loom-perf over $t under mpirun -np 4" 0 "${mpi[@]}" -np 4 -x LOOM_TRANSPORT=$t \
        -x LOOM_DEBUG=INFO -x LOOM_DEBUG_SUBSYS=NET "$perf" -b 8 -e 64K -f 4 -n 3 -w 1 -c 1; then
        perf_ok "loom-perf over $t"
        # every rank's links are the named transport's
        n=$(grep -cE "loom INFO NET.* $t[: ]" "$out")
        [ "$n" -ge 4 ] || fail "loom-perf over $t: $n INFO lines of the $t transport, want 4 or more"
    fi
done

# Without its PMIx server's address a rank of mpirun's job has no way to meet the others: an
# error naming what it found and lacks, never a job of one rank.
strip=(env -u PMIX_SERVER_URI -u PMIX_SERVER_URI2 -u PMIX_SERVER_URI21 -u PMIX_SERVER_URI3
       -u PMIX_SERVER_URI4 -u PMIX_SERVER_URI41)
if run "no rendezvous under mpirun -np 2" 1 "${mpi[@]}" -np 2 "${strip[@]}" "$prog"; then
    grep -q "found by OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, but no way to meet" "$out" ||
        fail "no rendezvous: the error does not name the variables"
    ! grep -q "ok$" "$out" || fail "no rendezvous: a rank ran alone"
fi
if run "loom-perf, no rendezvous under mpirun -np 2" 1 "${mpi[@]}" -np 2 "${strip[@]}" \
        "$perf" -b 8 -e 8; then
    grep -q "no PMIx server (PMIX_SERVER_URI\* unset) and no MASTER_ADDR/MASTER_PORT" "$out" ||
        fail "loom-perf, no rendezvous: the error does not say what is missing"
    ! grep -q "^# loom-perf" "$out" || fail "loom-perf, no rendezvous: it printed a table"
fi

[ $fails -eq 0 ] && echo "launch_mpirun: all passed" || echo "launch_mpirun: $fails failed"
[ $fails -eq 0 ]
