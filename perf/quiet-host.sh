#!/usr/bin/env bash
# Host-side measurements on a machine with idle cores (the GPU machine's CPUs: the dev VM's two
# cores are shared by everything else), in one command, each result tee'd into $OUT:
#
#   perf/quiet-host.sh [STAGE...]   # stages: mpi fusion tune ddp algos shm8 shm24 split mid small table ref nofile (default: all); OUT defaults
#                                   # to /tmp/loom-quiet
#
# Builds a host-only tree (build-quiet, CUDA off), then runs, interleaved and with medians as the
# programs do it: raw MPI against loom's mpi transport (4 MiB ping-pong; 64 MiB allreduce on 2
# and 4 ranks), and loom-fusion-bench on ResNet-50 and BERT-base at 4 ranks (one call per
# tensor, fused, Horovod's settings, monolithic); tune: loom-tune --model and --fusion into
# $OUT/tune.txt, then the benchmark's tuned mode reading it; ddp: perf/fusion-compare.sh (loom
# against PyTorch DDP over gloo) with the first python3 on PATH that has torch; split: a child
# of loomCommSplit against its parent, 8-byte allreduce (perf/probes/splitlat.c), 4, 8 and 16
# ranks, with and without the node segment; mid: the middle sizes (16 KiB-16 MiB, factor 2) at 4
# and 8 ranks, the automatic choice against ring, rabenseifner, rd and tree, with rank 0's TUNING
# line for each size and loom-tune --model at 8 ranks; table: loom-tune --algos at 8 and 4 ranks
# into $OUT/table.txt, then the automatic choice reading it against every forced algorithm (8 B
# to 16 MiB, 200 timed calls a size); ref: loom-tune --model at 4 and 8 ranks, 5 runs each (the
# built-in reference constants of comm.c are their medians); nofile: the table stage's sweep
# with no tuning file (the model and those constants decide); small: the same with no tuning
# file from 512 B to 128 KiB by 2, the automatic choice against rd, rabenseifner and the
# segment, at 8 and 4 ranks. Writes nothing
# outside build-quiet and $OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
out=${OUT:-/tmp/loom-quiet}
mkdir -p "$out"
export LOOM_SOCKET_IFNAME=lo OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$root/scripts/carried-deps.sh"
nproc > "$out/machine.txt"
lscpu | grep -E "Model name|^CPU\(s\)|Socket" >> "$out/machine.txt"
{ meson setup build-quiet -Dcuda=disabled -Dtests=false --buildtype=release >/dev/null &&
  ninja -C build-quiet mpi_vs_loom loom-fusion-bench loom-tune codecbench layout loom-perf splitlat; } > "$out/build.txt" 2>&1 ||
    { tail -20 "$out/build.txt"; exit 1; }
b=build-quiet
stages=${*:-mpi fusion tune ddp algos shm8 shm24 split mid small table ref nofile}
want() { [[ " $stages " == *" $1 "* ]]; }
run() { # name, command...
    local name=$1
    shift
    echo "== $name: $*" | tee -a "$out/results.txt"
    timeout "${limit:-150}" "$@" 2>&1 | tail -40 | tee -a "$out/results.txt"
}
if want mpi && [ -x $b/mpi_vs_loom ]; then
    run mpi-p2p mpirun -np 2 --bind-to core $b/mpi_vs_loom p2p
    run mpi-allreduce-2 mpirun -np 2 --bind-to core $b/mpi_vs_loom allreduce
    run mpi-allreduce-4 mpirun -np 4 --bind-to core $b/mpi_vs_loom allreduce
fi
if want fusion; then
    run codec $b/codecbench
    run fusion-resnet50 $b/loom-fusion-bench -P 4 -m resnet50 -n 5
    run fusion-bert $b/loom-fusion-bench -P 4 -m bert-base -n 3
fi
if want tune; then
    rm -f "$out/tune.txt"
    run tune-model $b/loom-tune --model -P 4 -o "$out/tune.txt" -r 3
    limit=300 run tune-fusion $b/loom-tune --fusion -m resnet50 -P 4 -o "$out/tune.txt" -r 3
    run fusion-resnet50-tuned $b/loom-fusion-bench -P 4 -m resnet50 -n 5 --tune-file "$out/tune.txt"
fi
if want ddp; then
    py=$(command -v python3)
    "$py" -c "import torch" 2>/dev/null || py=/usr/bin/python3
    BENCH=$b/loom-fusion-bench PYTHON=$py run ddp-resnet50 perf/fusion-compare.sh -P 4 -m resnet50 -r 3
fi
if want algos; then
    # the automatic choice against every flat algorithm, 4 ranks on shm, checked runs
    limit=400 run algos-4 /usr/bin/python3 perf/sweep -b 8 -e 64M -f 8 -P 4 \
        --algos "auto ring rd rabenseifner tree oneshot segment" --peers "" -r 3 --no-plots --loom $b/loom-perf \
        -o "$out/sweep-algos"
    cat "$out/sweep-algos/summary.md" >>"$out/results.txt" 2>/dev/null
fi
if want shm8; then
    # 8 local ranks on shm against Open MPI's shared memory (vader) in the same sweep (issue 16's
    # small-message target), and the automatic choice against the forced algorithms. Small sizes
    # get 2000 timed calls (a call of a few microseconds timed 20 times is at the mercy of one
    # preemption: 200 us of it is 10 us a call), the large ones the sweep's default.
    limit=420 run algos-8-small /usr/bin/python3 perf/sweep -b 8 -e 32K -f 8 -P 8 -n 2000 -w 200 \
        --algos "auto ring rd rabenseifner tree oneshot segment" --peers mpi-vader -r 3 --no-plots \
        --loom $b/loom-perf --peers-dir $b/perf-peers -o "$out/sweep-algos8-small"
    cat "$out/sweep-algos8-small/summary.md" >>"$out/results.txt" 2>/dev/null
    limit=420 run algos-8 /usr/bin/python3 perf/sweep -b 256K -e 32M -f 8 -P 8 \
        --algos "auto ring rd rabenseifner tree oneshot segment" --peers mpi-vader -r 3 --no-plots \
        --loom $b/loom-perf --peers-dir $b/perf-peers -o "$out/sweep-algos8"
    cat "$out/sweep-algos8/summary.md" >>"$out/results.txt" 2>/dev/null
fi
if want shm24; then
    # the small sizes on 2 and 4 ranks: the node segment against rd and vader
    for p in 2 4; do
        limit=300 run algos-$p-small /usr/bin/python3 perf/sweep -b 8 -e 32K -f 8 -P $p -n 2000 \
            -w 200 --algos "auto rd oneshot segment" --peers mpi-vader -r 3 --no-plots \
            --loom $b/loom-perf --peers-dir $b/perf-peers -o "$out/sweep-algos$p-small"
        cat "$out/sweep-algos$p-small/summary.md" >>"$out/results.txt" 2>/dev/null
    done
fi
if want split && [ -x $b/splitlat ]; then
    for k in 4 8 16; do
        run split-$k $b/splitlat -P $k -n 5000 -r 9
        LOOM_SEGMENT=0 run split-$k-noseg $b/splitlat -P $k -n 5000 -r 9
    done
fi
if want mid; then
    for p in 8 4; do
        LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TUNING $b/loom-perf -P $p -b 16K -e 16M -f 2 -n 1 -w 0 \
            -c 0 2>&1 | grep -E ":0 loom INFO TUNING allreduce" | sed 's/ \[constants.*//' \
            >"$out/mid-tuning-$p.txt"
        limit=400 run mid-$p /usr/bin/python3 perf/sweep -b 16K -e 16M -f 2 -P $p \
            --algos "auto ring rabenseifner rd tree" --peers "" -r 3 --no-plots --loom $b/loom-perf \
            -o "$out/sweep-mid$p"
        cat "$out/sweep-mid$p/summary.md" >>"$out/results.txt" 2>/dev/null
    done
    run tune-model-8 $b/loom-tune --model -P 8 -o "$out/tune8.txt" -r 3
fi
if want ref; then
    for p in 4 8; do
        for k in 1 2 3 4 5; do
            run ref-model-$p-$k $b/loom-tune --model -P $p -o "$out/ref$p-$k.txt" -r 3
            cat "$out/ref$p-$k.txt" >>"$out/results.txt"
        done
    done
fi
if want nofile; then
    for p in 8 4; do
        limit=400 run nofile-$p env -u LOOM_TUNE_FILE /usr/bin/python3 perf/sweep -b 8 -e 16M -f 4 \
            -P $p -n 200 -w 20 --algos "auto ring rd rabenseifner tree oneshot segment" --peers "" \
            -r 3 --no-plots --loom $b/loom-perf -o "$out/sweep-nofile$p"
        cat "$out/sweep-nofile$p/summary.md" >>"$out/results.txt" 2>/dev/null
    done
fi
if want small; then
    for p in 8 4; do
        limit=300 run small-$p env -u LOOM_TUNE_FILE /usr/bin/python3 perf/sweep -b 512 -e 128K \
            -f 2 -P $p -n 200 -w 20 --algos "auto rd rabenseifner segment" --peers "" -r 3 \
            --no-plots --loom $b/loom-perf -o "$out/sweep-small$p"
        cat "$out/sweep-small$p/summary.md" >>"$out/results.txt" 2>/dev/null
    done
fi
if want table; then
    rm -f "$out/table.txt"
    for p in 8 4; do
        run table-tune-$p $b/loom-tune --algos -P $p -o "$out/table.txt" -r 5
    done
    for p in 8 4; do
        LOOM_TUNE_FILE="$out/table.txt" limit=400 run table-$p /usr/bin/python3 perf/sweep -b 8 \
            -e 16M -f 4 -P $p -n 200 -w 20 --algos "auto ring rd rabenseifner tree oneshot segment" \
            --peers "" -r 3 --no-plots --loom $b/loom-perf -o "$out/sweep-table$p"
        cat "$out/sweep-table$p/summary.md" >>"$out/results.txt" 2>/dev/null
    done
fi
