#!/usr/bin/env bash
# Builds the peer benchmarks (peer_mpi, peer_gloo) that perf/compare.sh runs against loom-perf.
# usage: perf/peers/build.sh [OUTDIR]     (default: build/perf-peers, relative to the repo root)
# Needs: libopenmpi-dev (mpicc), libgloo-dev, g++. Either peer is skipped with a message when its
# toolchain is missing, so the other can still be built; the exit status is non-zero then.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/build/perf-peers}
mkdir -p "$out"

# Same warnings as the project; -fwrapv because the in-place timing loops sum int32 data into
# itself call after call and the reduction code (gloo's is header-only) must wrap, not be UB.
cflags=(-O2 -Wall -Wextra -fwrapv)
status=0

if command -v mpicc >/dev/null 2>&1; then
    # -D_GNU_SOURCE as in the project's meson.build (the sources do not define it themselves).
    mpicc -std=c11 -D_GNU_SOURCE "${cflags[@]}" -o "$out/peer_mpi" "$here/peer_mpi.c"
    echo "built $out/peer_mpi"
else
    echo "build.sh: mpicc not found (apt-get install libopenmpi-dev openmpi-bin);" \
        "skipping peer_mpi" >&2
    status=1
fi

# Debian's libgloo-dev ships no pkg-config file (only CMake config), so fall back to -lgloo;
# pkg-config is still asked first in case another packaging provides one.
if pkg-config --exists gloo 2>/dev/null; then
    gloo_cflags=$(pkg-config --cflags gloo)
    gloo_libs=$(pkg-config --libs gloo)
else
    gloo_cflags=
    gloo_libs=-lgloo
fi
if [ -f /usr/include/gloo/allreduce.h ] || [ -n "$gloo_cflags" ]; then
    # shellcheck disable=SC2086  # the pkg-config words must split
    g++ -std=c++14 "${cflags[@]}" $gloo_cflags -o "$out/peer_gloo" "$here/peer_gloo.cc" \
        $gloo_libs -pthread
    echo "built $out/peer_gloo"
else
    echo "build.sh: gloo headers not found (apt-get install libgloo-dev); skipping peer_gloo" >&2
    status=1
fi
exit $status
