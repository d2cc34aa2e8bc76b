#!/usr/bin/env bash
# meson test 'perf-flags': loom-perf's nccl-tests command line. Every refusal is one line naming
# the flag and the value, exit 2, nothing run; long and short forms agree; the program's name
# (all_reduce_perf, ...) chooses the collective; -J writes JSON in nccl-tests' layout; -c counts
# corrupted elements (LOOM_PERF_CORRUPT); under mpirun -np 8 all_reduce_perf is one job of 8
# ranks with no wrong element (skipped part where mpirun is missing).
set -u
perf=${1:?usage: tests/perf_flags_test.sh PATH/TO/loom-perf}
bin=$(cd "$(dirname "$perf")" && pwd)
export LOOM_SOCKET_IFNAME=lo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# refuse EXPECTED_LINE ARGS...: exit 2, exactly EXPECTED_LINE on stderr, nothing on stdout.
refuse() {
    local want=$1
    shift
    local rc=0
    timeout 20 "$perf" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    if [ "$rc" != 2 ]; then
        fail "loom-perf $*: exit $rc, expected 2"
    elif [ "$(cat "$tmp/err")" != "$want" ]; then
        fail "loom-perf $*: said '$(cat "$tmp/err")', expected '$want'"
    elif [ -s "$tmp/out" ]; then
        fail "loom-perf $*: printed on stdout: $(head -3 "$tmp/out")"
    fi
}

p=loom-perf
refuse "$p: -n abc: not a whole number (timed iterations: 1 to 2147483647)" -n abc
refuse "$p: -n 0: out of range (timed iterations: 1 to 2147483647)" -n 0
refuse "$p: -n -3: out of range (timed iterations: 1 to 2147483647)" -n -3
refuse "$p: -n 99999999999999999999: out of range (timed iterations: 1 to 2147483647)" \
    -n 99999999999999999999
refuse "$p: -n 5x: not a whole number (timed iterations: 1 to 2147483647)" -n 5x
refuse "$p: -n  5: not a whole number (timed iterations: 1 to 2147483647)" -n " 5"
refuse "$p: -c 5x: not a whole number (checked runs: 0 to 2147483647)" -c 5x
refuse "$p: -c -1: out of range (checked runs: 0 to 2147483647)" -c -1
refuse "$p: -w 1.5: not a whole number (warm-up iterations: 0 to 2147483647)" -w 1.5
refuse "$p: -m 0: out of range (calls per iteration: 1 to 1048576)" -m 0
refuse "$p: -N x: not a whole number (sweeps, 0 for no end: 0 to 2147483647)" -N x
refuse "$p: -f 1.5: not a whole number (size factor per step: 1 to 4294967296)" -f 1.5
refuse "$p: -f 0: out of range (size factor per step: 1 to 4294967296)" -f 0
refuse "$p: -p 2: out of range (0 or 1: 0 to 1)" -p 2
refuse "$p: -z yes: not a whole number (0 or 1: 0 to 1)" -z yes
refuse "$p: -y 3: out of range (0 or 1: 0 to 1)" -y 3
refuse "$p: -C 2: out of range (0 or 1: 0 to 1)" -C 2
refuse "$p: -a 4: out of range (0 rank 0, 1 mean, 2 min, 3 max: 0 to 3)" -a 4
refuse "$p: -T -1: out of range (seconds, 0 for none: 0 to 1073741824)" -T -1
refuse "$p: -r -1: out of range (a rank: 0 to 2147483647)" -r -1
size_why="not a size (the smallest size: bytes, with K, M or G for KiB, MiB, GiB)"
refuse "$p: -b 1Q: $size_why" -b 1Q
refuse "$p: -b -8: $size_why" -b -8
refuse "$p: -b 8 K: $size_why" -b "8 K"
refuse "$p: -b inf: $size_why" -b inf
refuse "$p: -b 0.3: not a whole number of bytes (the smallest size)" -b 0.3
refuse "$p: -e 1e30: too large (the largest size: at most 4611686018427387904 bytes)" -e 1e30
refuse "$p: -e 64MX: not a size (the largest size: bytes, with K, M or G for KiB, MiB, GiB)" \
    -e 64MX
refuse "$p: -b 67108864: larger than -e (8 bytes)" -b 64M -e 8
refuse "$p: -i 0: with -f 1 the sizes grow by -i bytes: at least 1" -i 0 -b 8 -e 16
refuse "$p: -t 2: loom-perf runs one rank per process and thread: only 1 (use -P K for K local \
ranks, or a launcher)" -t 2
refuse "$p: -g 2: loom-perf drives one GPU per rank process: only 1 (use -P K, or a launcher, \
for K GPUs)" -g 2
refuse "$p: -G 1: a CUDA graph captures work on a stream: it needs device buffers (--mem device)" \
    -G 1
refuse "$p: -G 5: a CUDA graph captures work on a stream: it needs device buffers (--mem device)" \
    --cudagraph 5 -m 2
refuse "$p: -G -1: out of range (graph launches: 0 to 2147483647)" -G -1
refuse "$p: -u 0xff: a CU mask (RCCL's --cumask) has no meaning for loom, which launches no \
kernels onto chosen compute units" -u 0xff
refuse "$p: -x 1: the CTA policy is NCCL's (ncclConfig_t.CTAPolicy); loom has none" -x 1
refuse "$p: -R 1: registration is for device buffers (--mem device); host buffers need none" -R 1
refuse "$p: -R 2: registration is for device buffers (--mem device); host buffers need none" -R 2
refuse "$p: -o add: unknown op (sum prod max min avg mulsum, or all)" -o add
refuse "$p: -d quad: unknown type (int8 uint8 int32 uint32 int64 uint64 half float double \
bfloat16 f8e4m3 f8e5m2, or all)" -d quad
refuse "$p: -P abc: not a whole number (local ranks to fork: 1 to 4096)" -P abc
refuse "$p: -P 0: out of range (local ranks to fork: 1 to 4096)" -P 0
refuse "$p: -P 100000: out of range (local ranks to fork: 1 to 4096)" -P 100000
refuse "$p: -q: unknown option (see --help)" -q
refuse "$p: --bogus: unknown option (see --help)" --bogus
refuse "$p: -n: needs a value (see --help)" -n
refuse "$p: stray: not an option (every value follows its flag; see --help)" -n 2 stray
refuse "$p: --collective allgathr: unknown collective (allreduce broadcast reduce allgather \
reducescatter alltoall sendrecv gather scatter)" --collective allgathr
refuse "$p: --mem disk: unknown memory (host or device)" --mem disk
refuse "$p: --backend mpi: unknown backend (loom or nccl)" --backend mpi

# -P against what the machine holds: 4096 ranks of 1 GiB buffers do not fit here, said at once
rc=0
timeout 20 "$perf" -P 4096 -e 1G >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] || fail "-P 4096 -e 1G: exit $rc, expected 2"
[ "$(wc -l <"$tmp/err")" = 1 ] &&
    grep -q "^$p: -P 4096: more ranks than this machine can hold: " "$tmp/err" ||
    fail "-P 4096 -e 1G: said '$(cat "$tmp/err")'"

# ... the rank's processes and threads against RLIMIT_NPROC, descriptors against RLIMIT_NOFILE
rc=0
(ulimit -u 40 && exec timeout 20 "$perf" -P 20 -b 8 -e 8) >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] && [ "$(cat "$tmp/err")" = "$p: -P 20: more ranks than this machine can hold: \
RLIMIT_NPROC allows 40 processes and threads for this user, and each rank needs about 4 (at most \
10 ranks)" ] || fail "-P 20 under ulimit -u 40: exit $rc, '$(cat "$tmp/err")'"
rc=0
(ulimit -n 64 && exec timeout 20 "$bin/alltoall_perf" -P 8 -b 8 -e 64) >"$tmp/out" 2>"$tmp/err" ||
    rc=$?
[ "$rc" = 2 ] && [ "$(cat "$tmp/err")" = "alltoall_perf: -P 8: more ranks than this machine can \
hold: alltoall reaches every peer, about 85 descriptors per rank, and RLIMIT_NOFILE is 64 (ulimit \
-n)" ] || fail "alltoall_perf -P 8 under ulimit -n 64: exit $rc, '$(cat "$tmp/err")'"
# A file rank 0 cannot write ends every rank at once, in one line.
rc=0
timeout 20 "$perf" -P 2 -b 8 -e 8 -J "$tmp/no/such/dir.json" >"$tmp/out" 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] && [ "$(cat "$tmp/err")" = "$p: -J $tmp/no/such/dir.json: cannot create \
$tmp/no/such/dir.json: No such file or directory" ] || fail "-J into no directory: exit $rc, '$(cat "$tmp/err")'"

# Long forms: the same refusal as the short form, naming the long flag.
while read -r s l v; do
    timeout 20 "$perf" "$s" "$v" >/dev/null 2>"$tmp/short"
    timeout 20 "$perf" "$l" "$v" >/dev/null 2>"$tmp/long"
    want=$(sed "s/^$p: $s /$p: $l /" "$tmp/short")
    [ -s "$tmp/short" ] && [ "$(cat "$tmp/long")" = "$want" ] ||
        fail "$l $v said '$(cat "$tmp/long")', expected '$want'"
done <<'EOF'
-t --nthreads x
-g --ngpus x
-b --minbytes x
-e --maxbytes x
-i --stepbytes x
-f --stepfactor x
-n --iters x
-m --agg_iters x
-w --warmup_iters x
-N --run_cycles x
-p --parallel_init x
-c --check x
-o --op x
-d --datatype x
-r --root x
-z --blocking x
-y --stream_null x
-T --timeout x
-G --cudagraph x
-C --report_cputime x
-a --average x
-R --local_register x
-u --cumask x
-x --cta_policy x
-P --local-ranks x
EOF

# run NAME ARGS...: a run that must succeed; its table is $tmp/NAME.
run() {
    local name=$1
    shift
    if ! timeout 120 "$@" >"$tmp/$name" 2>"$tmp/$name.err"; then
        fail "$name: $* failed: $(tail -3 "$tmp/$name.err")"
        return 1
    fi
}
rows() { grep -E '^ +[0-9]+ ' "$1"; }
# the rows' size, count, type, redop and root columns
shape() { rows "$1" | awk '{ print $1, $2, $3, $4, $5 }'; }

# Long and short forms of one run agree: the same header line and the same rows.
short=(-P 2 -b 64 -e 4K -f 4 -n 1 -w 0 -m 2 -N 2 -c 2 -d int32 -o max -z 1 -a 2 -C 0 -T 60)
long=(--local-ranks 2 --minbytes 64 --maxbytes 4K --stepfactor 4 --iters 1 --warmup_iters 0
      --agg_iters 2 --run_cycles 2 --check 2 --datatype int32 --op max --blocking 1 --average 2
      --report_cputime 0 --timeout 60)
if run short "$perf" "${short[@]}" && run long "$perf" "${long[@]}"; then
    [ "$(grep '^# nThread' "$tmp/short")" = "$(grep '^# nThread' "$tmp/long")" ] ||
        fail "long and short forms: different header lines"
    [ "$(shape "$tmp/short")" = "$(shape "$tmp/long")" ] ||
        fail "long and short forms: different rows"
    grep -q "^# nThread 1 nGpus 1 minBytes 64 maxBytes 4096 step: 4(factor) warmup iters: 0 \
iters: 1 agg iters: 2 validation: 2 graph: 0$" "$tmp/short" || fail "header line: $(grep '^# nThread' "$tmp/short")"
    [ "$(rows "$tmp/short" | wc -l)" = 8 ] || fail "-N 2: $(rows "$tmp/short" | wc -l) rows, expected 2 x 4"
fi

# nccl-tests' defaults: 32 MiB, stepping by 1 MiB with factor 1: -b 1M -e 3M gives 3 rows.
if run steps "$perf" -P 2 -b 1M -e 3M -n 1 -w 0; then
    [ "$(shape "$tmp/steps" | awk '{ print $1 }' | tr '\n' ' ')" = "1048576 2097152 3145728 " ] ||
        fail "-f 1 -i 1M: sizes $(shape "$tmp/steps" | awk '{ print $1 }' | tr '\n' ' ')"
fi

# The program's name chooses the collective; every row checked and right.
for pair in all_reduce_perf:allreduce all_gather_perf:allgather reduce_scatter_perf:reducescatter \
    broadcast_perf:broadcast reduce_perf:reduce alltoall_perf:alltoall sendrecv_perf:sendrecv \
    gather_perf:gather scatter_perf:scatter; do
    name=${pair%%:*} coll=${pair#*:}
    [ -x "$bin/$name" ] || { fail "$bin/$name is not built"; continue; }
    if run "$name" "$bin/$name" -P 3 -b 96 -e 96K -f 32 -n 1 -w 1 -r 2 -d all; then
        grep -q "^# Collective test starting: $name ($coll, 3 ranks)$" "$tmp/$name" ||
            fail "$name: header does not say $coll on 3 ranks"
        [ "$(rows "$tmp/$name" | wc -l)" = 36 ] || fail "$name: $(rows "$tmp/$name" | wc -l) rows, expected 3 sizes x 12 types"
        rows "$tmp/$name" | awk '$9 != 0 || ($13 != 0 && $13 != "N/A") { bad = 1 } END { exit bad }' ||
            fail "$name: wrong elements"
        grep -q "^# Out of bounds values : 0 OK$" "$tmp/$name" || fail "$name: no '0 OK' line"
        grep -q "^# Avg bus bandwidth    : " "$tmp/$name" || fail "$name: no Avg bus bandwidth line"
        [ "$(grep -c '^#  Rank  [0-2] Group  0 Pid ' "$tmp/$name")" = 3 ] || fail "$name: not 3 rank lines"
    fi
done
rc=0
"$bin/all_gather_perf" --collective allreduce >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] && [ "$(cat "$tmp/err")" = "all_gather_perf: --collective allreduce: this program \
measures allgather (all_gather_perf); run loom-perf --collective allreduce, or all_reduce_perf" ] ||
    fail "all_gather_perf --collective allreduce: exit $rc, '$(cat "$tmp/err")'"
rc=0
"$bin/broadcast_perf" -P 2 -r 5 -b 8 -e 8 >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" = 2 ] && [ "$(cat "$tmp/err")" = "broadcast_perf: -r 5: not a rank of this job (0 to 1: 2 ranks)" ] ||
    fail "broadcast_perf -r 5 on 2 ranks: exit $rc, '$(cat "$tmp/err")'"

# Every op, the pre-multiplied sum too, on every type: exact.
if run ops "$bin/reduce_scatter_perf" -P 3 -b 96 -e 96 -n 1 -w 1 -d all -o all; then
    [ "$(rows "$tmp/ops" | wc -l)" = 72 ] || fail "-d all -o all: $(rows "$tmp/ops" | wc -l) rows, expected 12 types x 6 ops"
    [ "$(rows "$tmp/ops" | awk '$4 == "mulsum"' | wc -l)" = 12 ] || fail "-o all: no mulsum rows"
    rows "$tmp/ops" | awk '$9 != 0 || $13 != 0 { bad = 1 } END { exit bad }' ||
        fail "-d all -o all: wrong elements"
fi

# -T: a wait longer than the timeout ends every rank, naming what it waited for.
rc=0
timeout 120 "$perf" -P 2 -b 16M -e 16M -n 100000 -w 0 -c 0 -T 1 >"$tmp/slow" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "-T 1: exit $rc, expected 2"
grep -q "^$p: rank [01]: -T 1: allreduce timed loop of 16777216 bytes (float) did not complete \
within 1 s$" "$tmp/slow" || fail "-T 1: no timeout line: $(tail -3 "$tmp/slow")"

# -J: nccl-tests' layout, loom's version, the arguments and the LOOM_*/NCCL_* variables; an
# existing file is never overwritten (FILE.0 next); the job secret's value is not written.
json=$tmp/out.json
: >"$json"
if LOOM_JOB_SECRET=do-not-print NCCL_PERF_TEST_MARK=1 run json "$perf" -P 2 -b 8 -e 1K -f 8 \
    -n 1 -w 0 -J "$json"; then
    grep -q "^# Writing JSON output to $json.0$" "$tmp/json" || fail "-J: existing file not kept"
    [ -s "$json" ] && fail "-J: the existing file was written"
    python3 - "$json.0" "$tmp/json" <<'EOF' || fail "-J: the JSON is not nccl-tests' layout"
import json, sys
d = json.load(open(sys.argv[1]))
rows = [l for l in open(sys.argv[2]) if l.strip() and not l.startswith("#")]
for k in ["version", "start_time", "args", "env", "nccl_version", "config", "results",
          "out_of_bounds", "average_bus_bandwidth", "errors", "end_time", "loom"]:
    assert k in d, k
assert d["version"] == 2
assert d["loom"]["version"] and d["loom"]["collective"] == "allreduce" and d["loom"]["ranks"] == 2
assert "-J" in d["args"] and d["args"][-1] == sys.argv[1][:-2]
assert "LOOM_SOCKET_IFNAME=lo" in d["env"] and "NCCL_PERF_TEST_MARK=1" in d["env"]
assert not any("do-not-print" in e for e in d["env"]), "the secret was written"
assert not any(e.startswith(("PATH=", "HOME=")) for e in d["env"])
c = d["config"]
assert c["minimum_bytes"] == 8 and c["maximum_bytes"] == 1024 and c["step_factor"] == 8
assert c["iterations"] == 1 and c["warmup_iters"] == 0 and c["validation"] == 1
assert [x["rank"] for x in c["devices"]] == [0, 1] and all(x["pid"] > 0 for x in c["devices"])
assert len(d["results"]) == len(rows) == 3, (len(d["results"]), len(rows))
for r, line in zip(d["results"], rows):
    f = line.split()
    assert r["size"] == int(f[0]) and r["count"] == int(f[1]) and r["type"] == f[2]
    assert r["redop"] == "sum" and int(r["root"]) == -1
    for place in ("out_of_place", "in_place"):
        assert set(r[place]) == {"time", "alg_bw", "bus_bw", "nwrong"}, r[place]
        assert r[place]["nwrong"] == 0 and r[place]["time"] > 0
assert d["out_of_bounds"] == {"count": 0, "okay": "true"}
EOF
fi

# -c really checks: LOOM_PERF_CORRUPT=R spoils rank R's output before it is checked.
rc=0
LOOM_PERF_CORRUPT=1 timeout 60 "$perf" -P 2 -b 64 -e 1K -f 4 -n 1 -w 0 -c 1 -J "$tmp/bad.json" \
    >"$tmp/bad" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "corrupted output: exit $rc, expected 1"
grep -q "^# Out of bounds values : 6 FAILED$" "$tmp/bad" || fail "corrupted output: $(grep 'Out of' "$tmp/bad")"
rows "$tmp/bad" | awk '$9 != 1 || $13 != 1 { bad = 1 } END { exit bad }' ||
    fail "corrupted output: #wrong is not 1 in every column"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["out_of_bounds"] == {"count": 6, "okay": "false"}' \
    "$tmp/bad.json" || fail "corrupted output: JSON out_of_bounds"
# ... and -c 0 does not: N/A, exit 0
rc=0
LOOM_PERF_CORRUPT=1 timeout 60 "$perf" -P 2 -b 64 -e 64 -n 1 -w 0 -c 0 >"$tmp/nocheck" 2>&1 || rc=$?
[ "$rc" = 0 ] && rows "$tmp/nocheck" | awk '$9 != "N/A" || $13 != "N/A" { bad = 1 } END { exit bad }' ||
    fail "-c 0: exit $rc or #wrong not N/A"

# One job of 8 ranks under mpirun (oversubscribed): one table, 8 rank lines, no wrong element.
if command -v mpirun >/dev/null; then
    rc=0
    timeout 600 mpirun --oversubscribe -np 8 -x LOOM_SOCKET_IFNAME "$bin/all_reduce_perf" \
        -b 8 -e 64M -f 4 -n 1 -w 1 >"$tmp/mpi" 2>&1 || rc=$?
    [ "$rc" = 0 ] || fail "mpirun -np 8 all_reduce_perf: exit $rc: $(tail -5 "$tmp/mpi")"
    [ "$(grep -c '^# Collective test starting: all_reduce_perf (allreduce, 8 ranks)$' "$tmp/mpi")" = 1 ] ||
        fail "mpirun -np 8: not one table of 8 ranks"
    [ "$(grep -c '^#  Rank  [0-7] Group  0 Pid ' "$tmp/mpi")" = 8 ] || fail "mpirun -np 8: not 8 rank lines"
    [ "$(rows "$tmp/mpi" | wc -l)" = 12 ] || fail "mpirun -np 8: $(rows "$tmp/mpi" | wc -l) rows, expected 12 (8 B to 32 MiB by 4)"
    rows "$tmp/mpi" | awk '$9 != 0 || $13 != 0 { bad = 1 } END { exit bad }' || fail "mpirun -np 8: #wrong not 0"
    grep -q "^# Out of bounds values : 0 OK$" "$tmp/mpi" || fail "mpirun -np 8: no '0 OK'"
else
    echo "perf_flags: mpirun not installed: the 8-rank mpirun part is skipped"
fi

[ $fails -eq 0 ] && echo "perf_flags: all passed" || echo "perf_flags: $fails failed"
[ $fails -eq 0 ]
