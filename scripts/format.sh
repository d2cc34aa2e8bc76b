#!/usr/bin/env bash
# The committed .clang-format over every C, CUDA and C++ source of the project.
# Usage: scripts/format.sh          rewrites the files in place
#        scripts/format.sh --check  changes nothing; lists what differs and exits 1 (CI runs it)
set -uo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-clang-format}
if ! command -v "$fmt" >/dev/null; then
    echo "format: $fmt not found (Debian's clang-format package; scripts/setup.sh installs it)"
    exit 77
fi
mapfile -t files < <(git ls-files 'src/*.c' 'src/*.h' 'src/*.cu' 'include/*.h' 'tests/*.c' \
    'tests/*.h' 'perf/*.c' 'perf/*.h' 'perf/*.cu' 'perf/*.cc' 'tools/*.c' 2>/dev/null)
if [ ${#files[@]} -eq 0 ]; then
    echo "format: no sources found (not a git checkout?)"
    exit 1
fi
if [ "${1:-}" = "--check" ]; then
    bad=0
    for f in "${files[@]}"; do
        if ! "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1; then
            echo "format: $f differs from .clang-format (run scripts/format.sh)"
            bad=$((bad + 1))
        fi
    done
    echo "format: ${#files[@]} files checked, $bad to reformat"
    [ "$bad" -eq 0 ]
else
    "$fmt" -i "${files[@]}"
fi
