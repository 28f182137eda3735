#!/bin/sh
# Strips the symbol tables and debug info some wheels ship in their shared objects (polars'
# runtime carries ~40 MiB of symbols, zstandard's two backends ~20 MiB of debug info), so that
# every cold start pulls less (docs/deploy-aws.md#image-size). Only files that still have a
# .symtab are touched; each is written anew and moved over the original, so a file hard-linked
# from an installer's cache (uv's) is replaced, never changed in place.
# Usage: scripts/strip-libraries.sh SITE_PACKAGES_DIR    (needs binutils: strip, readelf)
set -eu
site="$1"
find "$site" -type f \( -name '*.so' -o -name '*.so.*' \) | while read -r lib; do
    if readelf -S "$lib" 2>/dev/null | grep -q ' \.symtab '; then
        strip --strip-unneeded -o "$lib.stripped" "$lib"
        chmod --reference="$lib" "$lib.stripped"
        mv "$lib.stripped" "$lib"
    fi
done
