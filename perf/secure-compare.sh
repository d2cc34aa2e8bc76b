#!/usr/bin/env bash
# The cost of LOOM_SECURE=1 (sealed TCP frames) against plain TCP on loopback: loom-perf's
# allreduce (float sum) with LOOM_TRANSPORT=tcp, LOOM_SECURE=0 and 1, for each rank count and
# size, rounds interleaved (plain and sealed alternate, and which goes first alternates too, so
# a noisy machine's drift touches both alike). Prints per rank count and size the median
# out-of-place time of each mode over the rounds and the ratio sealed / plain.
#
# usage: perf/secure-compare.sh [-r ROUNDS] [-P "2 4"] [-b MIN] [-e MAX] [-f FACTOR]
#                               [-n ITERS] [-w WARMUP] [--loom PATH] [-m FILE.md] [-t TIMEOUT_S]
#   -r ROUNDS  runs of each mode per rank count (default 5)
#   -P LIST    rank counts (default "2 4")
#   -b/-e/-f   sizes: from MIN to MAX bytes, times FACTOR (default 8, 64M, 2)
#   -n/-w      timed/warmup iterations per size (default 20/5)
#   --loom     loom-perf binary (default build/loom-perf)
#   -m FILE    also write the table as markdown to FILE
#   -t         seconds before one run is killed (default 600)
# The cipher is AES-256-GCM where both ends have it in hardware, else ChaCha20-Poly1305; the
# script prints which one this machine picks.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=5
ranks="2 4"
minb=8
maxb=64M
factor=2
iters=20
warmup=5
loom=$root/build/loom-perf
markdown=
timeout_s=600

usage() { sed -n '8,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
    -r) rounds=$2; shift 2 ;;
    -P) ranks=$2; shift 2 ;;
    -b) minb=$2; shift 2 ;;
    -e) maxb=$2; shift 2 ;;
    -f) factor=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    -w) warmup=$2; shift 2 ;;
    --loom) loom=$2; shift 2 ;;
    -m) markdown=$2; shift 2 ;;
    -t) timeout_s=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "secure-compare: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
if [ ! -x "$loom" ]; then
    echo "secure-compare: $loom not found (build first: ninja -C build)" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LOOM_SOCKET_IFNAME=lo LOOM_TRANSPORT=tcp
unset LOOM_SECURE

# The cipher this machine picks, and one core's sealing speed with each (64 KiB records, as the
# transport seals them), through libsodium itself.
read -r cipher aead_speed < <(python3 - <<'EOF'
import ctypes, ctypes.util, time
s = ctypes.CDLL(ctypes.util.find_library("sodium"))
s.sodium_init()
aes = s.crypto_aead_aes256gcm_is_available()
n, total = 64 * 1024, 128 << 20
buf, tag = ctypes.create_string_buffer(n), ctypes.create_string_buffer(16)
key, nonce = ctypes.create_string_buffer(32), ctypes.create_string_buffer(12)
speeds = []
for name, fn in (("aes256gcm", "crypto_aead_aes256gcm_encrypt_detached"),
                 ("chacha20poly1305", "crypto_aead_chacha20poly1305_ietf_encrypt_detached")):
    if name == "aes256gcm" and not aes:
        continue
    f = getattr(s, fn)
    t = time.perf_counter()
    for _ in range(total // n):
        f(buf, tag, None, buf, ctypes.c_ulonglong(n), None, ctypes.c_ulonglong(0), None, nonce, key)
    speeds.append(f"{name}={total / (time.perf_counter() - t) / 1e9:.2f}GB/s")
print("AES-256-GCM" if aes else "ChaCha20-Poly1305", ",".join(speeds))
EOF
)
echo "secure-compare: $(nproc) cores, $(uname -r), cipher $cipher (one core seals: $aead_speed), $rounds rounds, -P \"$ranks\", $minb..$maxb x$factor, -n $iters -w $warmup"

for round in $(seq 1 "$rounds"); do
    for p in $ranks; do
        if [ $((round % 2)) -eq 1 ]; then modes="0 1"; else modes="1 0"; fi
        for sec in $modes; do
            out=$work/p$p-s$sec-r$round.csv
            if ! LOOM_SECURE=$sec timeout "$timeout_s" "$loom" -P "$p" -b "$minb" -e "$maxb" \
                -f "$factor" -n "$iters" -w "$warmup" -c 1 --csv "$out" \
                >"$work/log-p$p-s$sec-r$round" 2>&1; then
                echo "secure-compare: run failed (P=$p LOOM_SECURE=$sec round $round):" >&2
                tail -20 "$work/log-p$p-s$sec-r$round" >&2
                exit 1
            fi
            echo "  round $round -P $p LOOM_SECURE=$sec done"
        done
    done
done

python3 - "$work" "$ranks" "$markdown" "$cipher" <<'EOF'
import csv, glob, os, statistics, sys
work, ranks, md, cipher = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
times = {}  # (p, sec, size) -> [us]
for f in glob.glob(os.path.join(work, "p*-s*-r*.csv")):
    name = os.path.basename(f)
    p = int(name.split("-")[0][1:])
    sec = int(name.split("-")[1][1:])
    for row in csv.DictReader(open(f)):
        times.setdefault((p, sec, int(row["size"])), []).append(float(row["oop_time_us"]))
lines = ["| ranks | bytes | plain median (us) | sealed median (us) | sealed / plain | runs |",
         "|---:|---:|---:|---:|---:|---:|"]
for p in map(int, ranks):
    sizes = sorted({s for (q, _, s) in times if q == p})
    for s in sizes:
        a, b = times.get((p, 0, s), []), times.get((p, 1, s), [])
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        lines.append(f"| {p} | {s} | {ma:.1f} | {mb:.1f} | {mb / ma:.2f} | {min(len(a), len(b))} |")
print(f"allreduce float sum over tcp on lo, out-of-place time, cipher {cipher}")
print("\n".join(lines))
if md:
    with open(md, "w") as fh:
        fh.write("\n".join(lines) + "\n")
EOF
