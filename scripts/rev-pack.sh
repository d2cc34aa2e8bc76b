#!/usr/bin/env bash
# Packs source revisions for perf/rev-compare.sh on a machine without the repository's history:
# .base-src/REV.tar.gz per revision (git archive), to be carried with the working tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.base-src"
grep -qx '/.base-src/' "$root/.git/info/exclude" 2>/dev/null || echo '/.base-src/' >>"$root/.git/info/exclude"
for rev in "$@"; do
    git -C "$root" archive --format=tar.gz -o "$root/.base-src/$rev.tar.gz" "$rev"
done
ls -l "$root/.base-src"
