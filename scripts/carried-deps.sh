# Sourced by the scripts that build on the GPU machine (no package access): libraries it lacks,
# carried as Debian packages in .gpu-deps (scripts/gpu-deps.sh, run where the tree came from),
# unpacked into a private prefix, found by pkg-config at build time and by the loader at run
# time. Only where pkg-config has no copy of its own. Expects $root (the tree).
if ! pkg-config --exists libsodium 2>/dev/null && ls "$root"/.gpu-deps/*.deb >/dev/null 2>&1; then
    deps=/tmp/loom-gpu-deps
    for f in "$root"/.gpu-deps/*.deb; do
        dpkg-deb -x "$f" "$deps" || { echo "unpacking $f failed" >&2; exit 1; }
    done
    for pc in "$deps"/usr/lib/*/pkgconfig/*.pc; do
        sed -i "s|^prefix=.*|prefix=$deps/usr|" "$pc"
        export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    done
    for lib in "$deps"/usr/lib/*/; do
        export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    done
    echo "using the carried packages in .gpu-deps (unpacked in $deps)"
fi
