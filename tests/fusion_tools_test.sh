#!/usr/bin/env bash
# meson test 'fusion-tools': loom-fusion-bench and loom-tune on a small tensor list, end to end:
# the bench's results are exact (wrong=0) in every mode and it ends with its summary line;
# loom-tune --model and --fusion write one section of the tuning file between them (the second
# run merges into the first's); the bench's tuned mode and the library's selection then use that
# file (the TUNING log names it); a missing model is an error naming the path; under mpirun (when
# installed) the same bench runs on the launcher's ranks.
set -euo pipefail
bench=${1:?usage: tests/fusion_tools_test.sh LOOM-FUSION-BENCH LOOM-TUNE}
tune=${2:?usage: tests/fusion_tools_test.sh LOOM-FUSION-BENCH LOOM-TUNE}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export LOOM_SOCKET_IFNAME=lo LOOM_TIMEOUT=60
unset LOOM_TUNE_FILE
fail() { echo "FAIL: $*"; exit 1; }

# 24 tensors, backward order, 1 to 53 Ki elements (odd counts, several per bucket)
{
    echo "name,count,dtype,flops"
    for i in $(seq 0 23); do
        echo "t$i,$(( (i * 7919 % 32768) + 1 + (i % 3) * 10007 )),float32,$(( i * 1000000 ))"
    done
} >"$dir/small.csv"

"$bench" -P 3 -m "$dir/small.csv" -n 2 -w 0 >"$dir/b1.log" 2>&1 || { cat "$dir/b1.log"; fail "bench -P 3"; }
cat "$dir/b1.log"
grep -Eq '^fusion model=small ranks=3 per_tensor_us=[0-9.]+ fused_us=[0-9.]+ tuned_us=[0-9.]+ monolithic_us=[0-9.]+ hidden_pct=[0-9.]+ wrong=0$' "$dir/b1.log" ||
    fail "no summary line with wrong=0"

# simulated compute: the hidden share is reported
"$bench" -P 2 -m "$dir/small.csv" -n 1 -w 0 --gflops 100 --batch 1 >"$dir/b2.log" 2>&1 || { cat "$dir/b2.log"; fail "bench --gflops"; }
grep -q '^# hidden: fused' "$dir/b2.log" || { cat "$dir/b2.log"; fail "no hidden line with --gflops"; }
grep -q 'wrong=0$' "$dir/b2.log" || fail "wrong results with compute"

"$tune" --model -P 2 -o "$dir/t.txt" -r 1 >"$dir/m.log" 2>&1 || { cat "$dir/m.log"; fail "loom-tune --model"; }
cat "$dir/m.log"
for k in alpha.shm.local beta.shm.local alpha.tcp.local beta.tcp.local gamma; do
    grep -q "^$k = " "$dir/t.txt" || fail "$k missing from the tuning file"
done
"$tune" --fusion -P 2 -m "$dir/small.csv" -o "$dir/t.txt" -r 1 >"$dir/f.log" 2>&1 || { cat "$dir/f.log"; fail "loom-tune --fusion"; }
cat "$dir/f.log"
grep -q '^# chosen: bucket=' "$dir/f.log" || fail "no search table"
[[ $(grep -c '^\[ranks=2 layout=1x2 mem=host\]' "$dir/t.txt") == 1 ]] || { cat "$dir/t.txt"; fail "not one section"; }
grep -q '^alpha.shm.local = ' "$dir/t.txt" || fail "--fusion dropped the model's constants"
thr=$(sed -n 's/^fusion_threshold = //p' "$dir/t.txt")
[[ -n $thr ]] || fail "no fusion_threshold"

LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TUNING "$bench" -P 2 -m "$dir/small.csv" -n 1 -w 0 \
    --tune-file "$dir/t.txt" >"$dir/b3.log" 2>&1 || { cat "$dir/b3.log"; fail "bench with the tuning file"; }
grep -q "^# tuned: bucket $thr, " "$dir/b3.log" || { cat "$dir/b3.log"; fail "tuned mode did not take bucket $thr"; }
grep -q "\[constants: $dir/t.txt:" "$dir/b3.log" || { cat "$dir/b3.log"; fail "selection did not use the file"; }

# --algos: every candidate timed, the winners by size merged into the same section; the
# library's selection then names the measured table
"$tune" --algos -P 2 -b 8 -e 512K -o "$dir/t.txt" -r 1 >"$dir/a.log" 2>&1 || { cat "$dir/a.log"; fail "loom-tune --algos"; }
cat "$dir/a.log"
grep -q '^# loom-tune --algos: 2 ranks on 1 nodes, 8 to 524288 bytes' "$dir/a.log" || fail "no --algos header"
grep -Eq '^   x4 +524288 ' "$dir/a.log" || fail "524288 bytes not measured"
table=$(sed -n 's/^allreduce_algos = //p' "$dir/t.txt")
[[ $table =~ ^0:[a-z:]+( [0-9]+:[a-z:]+)*$ ]] || { cat "$dir/t.txt"; fail "allreduce_algos: '$table'"; }
grep -q "^fusion_threshold = $thr$" "$dir/t.txt" || fail "--algos dropped the fusion choice"
[[ $(grep -c '^\[ranks=2 layout=1x2 mem=host\]' "$dir/t.txt") == 1 ]] || { cat "$dir/t.txt"; fail "not one section after --algos"; }
LOOM_TUNE_FILE="$dir/t.txt" LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=TUNING "$bench" -P 2 -m "$dir/small.csv" \
    -n 1 -w 0 >"$dir/b6.log" 2>&1 || { cat "$dir/b6.log"; fail "bench with the measured table"; }
grep -q "taken from the tuning file's measured table ($dir/t.txt:" "$dir/b6.log" ||
    { cat "$dir/b6.log"; fail "selection did not take the measured table"; }
for bad in "-b 3" "-b 1M -e 64K" "-e 5G" "-b 1X"; do
    # shellcheck disable=SC2086
    if "$tune" --algos $bad >"$dir/t3.log" 2>&1; then fail "--algos $bad accepted"; fi
    grep -q '^loom-tune: -[be] ' "$dir/t3.log" || { cat "$dir/t3.log"; fail "--algos $bad: no message naming the flag"; }
done

# --mem takes host or device, and device only for the fusion search
if "$tune" --fusion --mem gpu >"$dir/t1.log" 2>&1; then fail "--mem gpu accepted"; fi
grep -q -- '--mem gpu: expected host or device' "$dir/t1.log" || { cat "$dir/t1.log"; fail "--mem gpu"; }
if "$tune" --model --mem device >"$dir/t2.log" 2>&1; then fail "--model --mem device accepted"; fi
grep -q -- '--mem device goes with --fusion only' "$dir/t2.log" || { cat "$dir/t2.log"; fail "--model --mem device"; }

if "$bench" -P 2 -m "$dir/none.csv" >"$dir/b4.log" 2>&1; then fail "a missing model succeeded"; fi
grep -q "$dir/none.csv: No such file" "$dir/b4.log" || { cat "$dir/b4.log"; fail "the error does not name the path"; }

if command -v mpirun >/dev/null; then
    mpirun -np 2 --oversubscribe "$bench" -m "$dir/small.csv" -n 1 -w 0 >"$dir/b5.log" 2>&1 ||
        { cat "$dir/b5.log"; fail "under mpirun"; }
    grep -q '^fusion model=small ranks=2 .* wrong=0$' "$dir/b5.log" || { cat "$dir/b5.log"; fail "mpirun summary"; }
    echo "mpirun: ok"
fi
echo "fusion tools: ok"
