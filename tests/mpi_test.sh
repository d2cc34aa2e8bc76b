#!/usr/bin/env bash
# The mpi transport and loom started from MPI, under Open MPI's mpirun (oversubscribed, loopback
# only). Usage: mpi_test.sh MPI_PROG [LOOM_PERF]. Exits 77 (skipped) without mpirun. Every run is
# bounded by timeout.
#
# A rank that dies makes mpirun kill the whole job at once, before the survivors could say
# anything; the killed-rank case runs with --enable-recovery, so that the survivors live on and
# their loom errors (which must name the dead rank) are what the test reads.
set -u
prog=$1 perf=${2:-}
command -v mpirun >/dev/null || { echo "mpi_test: no mpirun: skipped"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LOOM_SOCKET_IFNAME=lo
unset LOOM_TRANSPORT LOOM_JOB_SECRET MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOOM_RANK
mpi=(mpirun --oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
     -x LOOM_SOCKET_IFNAME)
out=$(mktemp) fails=0
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; sed 's/^/    /' "$out" | cut -c1-400 | tail -40; fails=$((fails + 1)); }

# run NAME SECONDS NP_EXPECTED_OK CMD...: the output lands in $out; passes when the command exits
# 0 and NP_EXPECTED_OK lines end in " ok (...)" (or the given pattern via $want)
run() {
    local name=$1 secs=$2 n=$3; shift 3
    timeout -k 5 "$secs" "$@" >"$out" 2>&1
    local rc=$?
    local got
    got=$(grep -cE "${want:-^mpi_prog: rank [0-9]+ of [0-9]+: [a-z]+ ok \([0-9]+ checks\)$}" "$out")
    if [ $rc -ne 0 ] || [ "$got" != "$n" ]; then
        fail "$name: exit $rc, $got of $n ranks passed"
        return 1
    fi
    echo "ok: $name"
}

for np in 2 3 4 8; do
    run "grid over mpi, $np ranks" 300 "$np" "${mpi[@]}" -np "$np" -x LOOM_TRANSPORT=mpi \
        -x LOOM_TIMEOUT=30 "$prog" grid
done
for np in 2 4; do
    run "grid over tcp, $np ranks (loomCommInitMpi)" 300 "$np" "${mpi[@]}" -np "$np" \
        -x LOOM_TRANSPORT=tcp -x LOOM_TIMEOUT=30 "$prog" grid
done
# UCX under mpirun (when this loom has it: MPI_PROG_UCX=1 from the build), the worker addresses
# through the bootstrap of a communicator made from MPI
if [ "${MPI_PROG_UCX:-0}" = 1 ]; then
    for np in 2 4; do
        run "grid over ucx, $np ranks (loomCommInitMpi)" 300 "$np" "${mpi[@]}" -np "$np" \
            -x LOOM_TRANSPORT=ucx -x LOOM_TIMEOUT=30 "$prog" grid
    done
fi
run "grid over mpi, 3 ranks, loomCommInitFromEnv under MPI" 300 3 "${mpi[@]}" -np 3 \
    -x LOOM_TRANSPORT=mpi -x LOOM_TIMEOUT=30 -x LOOM_DEBUG=INFO -x LOOM_DEBUG_SUBSYS=BOOT \
    "$prog" grid env && {
    n=$(grep -c "met through MPI (MPI_COMM_WORLD" "$out")
    [ "$n" = 3 ] || fail "loomCommInitFromEnv under MPI: $n of 3 ranks met through MPI"
}
run "grid over mpi, 5 ranks split in two (loomCommInitMpi on MPI_Comm_split)" 300 5 \
    "${mpi[@]}" -np 5 -x LOOM_TRANSPORT=mpi -x LOOM_TIMEOUT=30 "$prog" split
for level in single funneled serialized; do
    run "grid over mpi, 3 ranks, MPI_THREAD_${level^^}" 300 3 "${mpi[@]}" -np 3 \
        -x LOOM_TRANSPORT=mpi -x LOOM_TIMEOUT=30 -x MPI_PROG_LEVEL=$level -x MPI_PROG_LARGE=4099 \
        "$prog" grid
done

want="^mpi_prog: rank [0-2]: second thread refused: .*MPI_THREAD_FUNNELED" \
    run "MPI_THREAD_FUNNELED: a loom call from a second thread is refused" 120 3 \
    "${mpi[@]}" -np 3 -x LOOM_TRANSPORT=mpi -x LOOM_TIMEOUT=10 -x MPI_PROG_LEVEL=funneled \
    "$prog" thread
want="^mpi_prog: rank 1: mismatch reported" run "length mismatch over mpi" 120 1 \
    "${mpi[@]}" -np 2 -x LOOM_TRANSPORT=mpi -x LOOM_TIMEOUT=10 "$prog" mismatch
want="^mpi_prog: rank [0-9]+ of 3: stall ok: .*rank 2 \(MPI rank 2" \
    run "a stalled rank (SIGSTOP) named over mpi, 3 ranks" 120 2 \
    "${mpi[@]}" -np 3 -x LOOM_TRANSPORT=mpi -x LOOM_TIMEOUT=2 "$prog" stall &&
    { grep -q "rank 2 of 3: stalled rank failed too" "$out" ||
      fail "stall, 3 ranks: the continued rank did not fail"; }
# A stopped and a killed rank give the same words over every transport, only the peer's
# address in parentheses differs (tcp: host:port, ucx: host:pid, mpi: its MPI rank and pid):
# the operation with its seq, then "no progress from rank 3 (...) for 2.0 s (LOOM_TIMEOUT=2)
# while receiving from it; the peer is stalled or dead"; for a killed rank the job-state
# service's verdict "rank 3 (host, pid N) died during allreduce seq 1 (...)" (or "... during
# the job, while this rank was outside calls", when it comes first), or, without it, the
# transport's own words naming rank 3 and the operation's seq (tcp: "connection closed by rank
# 3 (...)", ucx: "connection to rank 3 (...) failed", mpi: "no progress from rank 3 (...)").
transports="tcp mpi"
[ "${MPI_PROG_UCX:-0}" = 1 ] && transports+=" ucx"
for t in $transports; do
    want="^mpi_prog: rank [0-2] of 4: stall ok: .*allreduce seq 1 \(count 65536, float32, sum\): no progress from rank 3 \([^)]+\) for [0-9.]+ s \(LOOM_TIMEOUT=2\) while (sending to|receiving from) it; the peer is stalled or dead" \
        run "a stalled rank (SIGSTOP) named over $t, 4 ranks" 120 3 \
        "${mpi[@]}" -np 4 -x LOOM_TRANSPORT=$t -x LOOM_TIMEOUT=2 "$prog" stall &&
        { grep -q "rank 3 of 4: stalled rank failed too" "$out" ||
          fail "stall over $t: the continued rank did not fail"; }
    run "a rank computing 5 s before its first call and between calls (LOOM_TIMEOUT=2) waited for over $t, 4 ranks" 120 4 \
        "${mpi[@]}" -np 4 -x LOOM_TRANSPORT=$t -x LOOM_TIMEOUT=2 "$prog" late
    want="^mpi_prog: rank [0-2] of 4: kill ok: ((.*: )?rank 3 \([^)]*pid [0-9]+\) died during (allreduce seq 1 |the job, while this rank was outside calls)|.*allreduce seq 1 .*rank 3 \()" \
        run "a killed rank (SIGKILL) named over $t, 4 ranks" 120 3 \
        "${mpi[@]}" --enable-recovery -np 4 -x LOOM_TRANSPORT=$t -x LOOM_TIMEOUT=2 "$prog" kill
done

if [ -n "$perf" ]; then
    want="^# Collective test starting: loom-perf \(allreduce, 4 ranks\)" run "loom-perf over mpi under mpirun -np 4" 300 1 \
        "${mpi[@]}" -np 4 -x LOOM_TRANSPORT=mpi -x LOOM_TIMEOUT=30 "$perf" -b 8 -e 1M -f 8 -n 3 \
        -w 1 -c 1 && {
        awk '/^ +[0-9]+ / && ($9 != 0 || $13 != 0) { bad = 1 } END { exit bad }' "$out" ||
            fail "loom-perf over mpi: #wrong not 0"
    }
fi

[ $fails -eq 0 ] && echo "mpi_test: all passed" || echo "mpi_test: $fails failed"
[ $fails -eq 0 ]
