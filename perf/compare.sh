#!/usr/bin/env bash
# Compares loom's host allreduce with its peers on this machine, all timed the same way (see
# perf/peers/): loom-perf, Open MPI over TCP on lo, Open MPI over shared memory (vader), Gloo.
#
# usage: perf/compare.sh [-r ROUNDS] [-s SIZE] [-P "2 4"] [--loom PATH] [-m FILE.md]
#                        [-n ITERS] [-w WARMUP] [-A GLOO_ALGOS] [-t TIMEOUT_S] [--peers DIR]
#   -r ROUNDS  runs of each peer per rank count (default 5); the table shows median and min
#   -s SIZE    bytes per allreduce, K/M/G suffixes (default 64M), float sum
#   -P LIST    rank counts (default "2 4")
#   --loom     loom-perf binary (default build/loom-perf); if missing, loom is skipped
#   -m FILE    also write the tables as markdown to FILE
#   -n/-w      timed/warmup iterations per run (default 20/5, as nccl-tests)
#   -A         gloo algorithms, comma-separated, or "all" to take the fastest (default all)
#   -t         seconds before one run is killed (default 300)
#   --peers    where the peer binaries are (default build/perf-peers; built there if missing)
# The times compared are the out-of-place ones from each program's --csv (mean per call,
# averaged over ranks). Peers are interleaved round by round, so slow drift of a noisy machine
# affects all of them alike instead of whichever happened to run last.
# At the defaults gloo dominates the run time (it times every algorithm): on an idle 2-core
# machine roughly 10 minutes in all; -A ring_chunked,bcube or fewer rounds make it quicker.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=5
size=64M
ranks="2 4"
loom=$root/build/loom-perf
markdown=
iters=20
warmup=5
gloo_algos=all
timeout_s=300
peers_dir=$root/build/perf-peers

usage() { sed -n '5,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
    -r) rounds=$2; shift 2 ;;
    -s) size=$2; shift 2 ;;
    -P) ranks=$2; shift 2 ;;
    --loom) loom=$2; shift 2 ;;
    -m) markdown=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    -A) gloo_algos=$2; shift 2 ;;
    -t) timeout_s=$2; shift 2 ;;
    --peers) peers_dir=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
case $rounds in '' | *[!0-9]* | 0) echo "compare.sh: -r needs a positive number" >&2; exit 2 ;; esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-compare.XXXXXX")
child=
trap 'rm -rf "$tmp"' EXIT
# timeout(1) puts its command in a process group of its own, which a ^C at the terminal does not
# reach; so pass the signal on (timeout then ends the whole group) and let EXIT clean up.
on_signal() {
    if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; fi
    exit 130
}
trap on_signal INT TERM HUP

if [ ! -x "$peers_dir/peer_mpi" ] || [ ! -x "$peers_dir/peer_gloo" ]; then
    echo "compare.sh: building peers into $peers_dir" >&2
    "$root/perf/peers/build.sh" "$peers_dir" >&2 || true # run what could be built
fi

peers=()
if [ -x "$loom" ]; then
    peers+=(loom)
else
    echo "compare.sh: $loom not found or not executable; skipping loom (no ratios)" >&2
fi
if [ -x "$peers_dir/peer_mpi" ] && command -v mpirun >/dev/null 2>&1; then
    peers+=(mpi-tcp mpi-vader)
else
    echo "compare.sh: peer_mpi or mpirun missing; skipping Open MPI" >&2
fi
if [ -x "$peers_dir/peer_gloo" ]; then
    peers+=(gloo)
else
    echo "compare.sh: peer_gloo missing; skipping Gloo" >&2
fi
if [ ${#peers[@]} -eq 0 ]; then
    echo "compare.sh: nothing to run" >&2
    exit 1
fi

# Open MPI refuses to run as root unless told it is meant.
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
common=(-b "$size" -e "$size" -f 2 -n "$iters" -w "$warmup" -d float -o sum -c 1)
# pml ob1 is named so the btl list is what is used even where UCX would win the selection;
# vader is named rather than left to default so the row's label is certain.
mpi_common=(--oversubscribe --bind-to none --mca pml ob1)

# run_peer PEER NRANKS CSV LOG: one benchmark run, bounded by timeout(1).
run_peer() {
    local peer=$1 k=$2 csv=$3 log=$4
    local -a cmd
    case $peer in
    loom) cmd=(env LOOM_SOCKET_IFNAME=lo "$loom" -P "$k" "${common[@]}" --csv "$csv") ;;
    mpi-tcp)
        # shellcheck disable=SC2054  # the commas belong to Open MPI's btl list
        cmd=(mpirun -np "$k" "${mpi_common[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo
            "$peers_dir/peer_mpi" "${common[@]}" --csv "$csv") ;;
    mpi-vader)
        # shellcheck disable=SC2054
        cmd=(mpirun -np "$k" "${mpi_common[@]}" --mca btl self,vader
            "$peers_dir/peer_mpi" "${common[@]}" --csv "$csv") ;;
    gloo)
        cmd=("$peers_dir/peer_gloo" -P "$k" -A "$gloo_algos" -t "$timeout_s"
            "${common[@]}" --csv "$csv") ;;
    esac
    # In the background and waited for, so that a signal to this script is handled at once.
    timeout -k 10 "$timeout_s" "${cmd[@]}" >"$log" 2>&1 </dev/null &
    child=$!
    local rc=0
    wait "$child" || rc=$?
    child=
    return $rc
}

# oop_time_us CSV: the out-of-place time of the first data row, found by header name.
oop_time_us() {
    awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "oop_time_us") c = i; next }
             c && NF >= c { print $c; exit }' "$1"
}

# stats FILE: "median min count" of the numbers in FILE (microseconds), or nothing if empty.
stats() {
    [ -s "$1" ] || return 0
    sort -g "$1" | awk '{ v[NR] = $1 }
        END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
              print m, v[1], NR }'
}

for k in $ranks; do
    for ((round = 1; round <= rounds; round++)); do
        # Rotate the order each round so no peer always runs first (cold) or last.
        n=${#peers[@]}
        for ((j = 0; j < n; j++)); do
            peer=${peers[$(((j + round - 1) % n))]}
            csv=$tmp/$peer.$k.$round.csv
            log=$tmp/$peer.$k.$round.log
            echo "compare.sh: $k ranks, round $round/$rounds: $peer" >&2
            if run_peer "$peer" "$k" "$csv" "$log" && [ -s "$csv" ]; then
                t=$(oop_time_us "$csv")
                if [ -n "$t" ]; then
                    echo "$t" >>"$tmp/$peer.$k.times"
                else
                    echo "compare.sh: $peer: no data row in its CSV" >&2
                fi
                if [ "$peer" = gloo ]; then
                    # The last column names this round's fastest gloo algorithms, "oop/ip"
                    # when they differ; only the out-of-place one is compared here.
                    awk '!/^#/ && NF { split($NF, a, "/"); print a[1]; exit }' "$log" \
                        >>"$tmp/gloo.$k.algos"
                fi
            else
                echo "compare.sh: $peer failed at $k ranks (round $round); its output ends:" >&2
                tail -n 15 "$log" >&2 || true
            fi
        done
    done
done

# Tables: one per rank count, text on stdout and optionally markdown.
text=$tmp/table.txt
md=$tmp/table.md
: >"$text"
: >"$md"
for k in $ranks; do
    loom_median=
    if [ -s "$tmp/loom.$k.times" ]; then
        read -r loom_median _ _ < <(stats "$tmp/loom.$k.times")
    fi
    title="$k ranks, $size float sum, out-of-place, $rounds rounds of $iters iterations"
    {
        echo "## $title"
        echo
        echo "| peer | median (ms) | min (ms) | runs ok | loom is X faster (peer/loom median) |"
        echo "| --- | ---: | ---: | ---: | ---: |"
    } >>"$md"
    {
        echo "$title"
        printf '  %-36s %12s %10s %8s  %s\n' peer "median(ms)" "min(ms)" "runs ok" \
            "loom is X faster"
    } >>"$text"
    for peer in "${peers[@]}"; do
        label=$peer
        if [ "$peer" = gloo ] && [ -s "$tmp/gloo.$k.algos" ]; then
            label="gloo ($(sort "$tmp/gloo.$k.algos" | uniq -c |
                awk '{ printf "%s%s x%d", (NR > 1 ? ", " : ""), $2, $1 }'))"
        fi
        read -r median min ok < <(stats "$tmp/$peer.$k.times" || true) || true
        if [ -z "${median:-}" ]; then
            median_ms=n/a min_ms=n/a ok=0 ratio=n/a
        else
            median_ms=$(awk -v v="$median" 'BEGIN { printf "%.2f", v / 1000 }')
            min_ms=$(awk -v v="$min" 'BEGIN { printf "%.2f", v / 1000 }')
            if [ -n "$loom_median" ]; then
                ratio=$(awk -v p="$median" -v l="$loom_median" 'BEGIN { printf "%.2fx", p / l }')
            else
                ratio="n/a (no loom)"
            fi
        fi
        printf '  %-36s %12s %10s %5s/%-2s  %s\n' "$label" "$median_ms" "$min_ms" "$ok" \
            "$rounds" "$ratio" >>"$text"
        echo "| $label | $median_ms | $min_ms | $ok/$rounds | $ratio |" >>"$md"
        unset median min ok
    done
    echo >>"$text"
    echo >>"$md"
done
cat "$text"
if [ -n "$markdown" ]; then
    cp "$md" "$markdown"
    echo "compare.sh: wrote $markdown" >&2
fi
