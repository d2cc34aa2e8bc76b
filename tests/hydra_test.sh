#!/usr/bin/env bash
# loom under MPICH's launcher (mpiexec.hydra), which speaks PMI-1: the ranks meet through its
# server with no MPI library in the program, over the descriptor Hydra leaves (PMI_FD) and over
# its port (-pmi-port: PMI_PORT and PMI_ID only, the size from the server). Then the failure
# paths: a rank that never arrives (the others name the barrier they waited at, within their
# bound), and a server that refuses (its words are quoted). Usage: hydra_test.sh LOOM_PERF.
# Exits 77 (skipped) without mpiexec.hydra (Debian's mpich package). Loopback only, every run
# bounded by timeout.
set -u
perf=$1
command -v mpiexec.hydra >/dev/null || { echo "hydra_test: no mpiexec.hydra: skipped"; exit 77; }
export LOOM_SOCKET_IFNAME=lo
unset LOOM_TRANSPORT LOOM_JOB_SECRET MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOOM_RANK \
    OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMIX_RANK PMIX_NAMESPACE SLURM_PROCID SLURM_NTASKS
out=$(mktemp) fails=0
trap 'rm -f "$out"; [ -n "${srv:-}" ] && kill "$srv" 2>/dev/null' EXIT
fail() { echo "FAIL: $*"; sed 's/^/    /' "$out" | cut -c1-400 | tail -30; fails=$((fails + 1)); }
# expect NAME PATTERN COUNT: COUNT lines of $out match PATTERN
expect() {
    local got
    got=$(grep -cE -- "$2" "$out")
    if [ "$got" != "$3" ]; then
        fail "$1: $got lines match '$2', want $3"
        return 1
    fi
    return 0
}

for mode in fd port; do
    for np in 2 3 4; do
        flags=()
        [ $mode = port ] && flags=(-pmi-port)
        timeout -k 5 120 mpiexec.hydra "${flags[@]}" -n "$np" "$perf" -b 8 -e 1M -f 64 -c 1 \
            >"$out" 2>&1
        rc=$?
        name="loom-perf, $np ranks over PMI-1 ($mode)"
        [ $rc -eq 0 ] || { fail "$name: exit $rc"; continue; }
        expect "$name" "^# Collective test starting: .*\\(allreduce, $np ranks\\)" 1 &&
            expect "$name" "^# Out of bounds values : 0 OK" 1 && echo "ok: $name"
    done
done

# A rank that never calls the init: the others wait at the PMI-1 barrier for 4 x LOOM_TIMEOUT and
# then say so, naming the server; Hydra ends the job once the first of them exits (so the other
# may be killed before it speaks: at least one line).
start=$(date +%s)
LOOM_TIMEOUT=2 timeout -k 5 60 mpiexec.hydra -n 3 sh -c \
    'if [ "$PMI_RANK" = 2 ]; then sleep 30; else exec "$0" -b 8 -e 8; fi' "$perf" >"$out" 2>&1
rc=$? took=$(($(date +%s) - start))
name="a rank that never arrives"
if [ $rc -eq 0 ] || [ $took -ge 40 ]; then
    fail "$name: exit $rc after $took s"
else
    n=$(grep -cE "WARN BOOT rank [01]: no reply from the PMI-1 server \\(PMI_FD=[0-9]+\\) to cmd=barrier_in within 8 s" "$out")
    if [ "$n" -ge 1 ]; then echo "ok: $name ($took s, $n ranks said so)"; else fail "$name: no rank named the barrier"; fi
fi

# A server that refuses the init: loom quotes its reply. A small PMI-1 server on loopback that
# accepts the introduction and then answers init with an error.
py=$(command -v python3)
port_file=$(mktemp)
"$py" - "$port_file" <<'EOF' &
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
c, _ = s.accept()
f = c.makefile("rwb", buffering=0)
assert f.readline().startswith(b"cmd=initack")
f.write(b"cmd=initack\ncmd=set size=2\ncmd=set rank=1\ncmd=set debug=0\n")
assert f.readline().startswith(b"cmd=init ")
f.write(b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1 msg=version_not_supported\n")
f.readline()
EOF
srv=$!
for _ in $(seq 50); do [ -s "$port_file" ] && break; sleep 0.1; done
PMI_PORT=127.0.0.1:$(cat "$port_file") PMI_ID=1 timeout -k 5 30 "$perf" -b 8 -e 8 >"$out" 2>&1
rc=$?
wait "$srv" 2>/dev/null
srv=
rm -f "$port_file"
name="a server that refuses the init"
if [ $rc -eq 0 ]; then
    fail "$name: exit 0"
else
    expect "$name" "WARN BOOT rank 1: the PMI-1 server \\(PMI_PORT=127.0.0.1:[0-9]+\\) answered cmd=init with .*rc=-1.*: version_not_supported" 1 &&
        echo "ok: $name"
fi

echo "hydra_test: $fails failed"
[ $fails -eq 0 ]
