#!/bin/sh
# Unpack Debian's CPython 3.11 source and apply its security patches: shared by the x86_64
# build (build_python.sh, inside the root) and the arm64 cross build (bundle_spec/python.py).
#
# Usage: python_source.sh SRC_DIR WORK_DIR
#   SRC_DIR  holds Debian's python3.11_*.orig.tar.gz and python3.11_*.debian.tar.xz
#   WORK_DIR is emptied, then holds the patched source tree
set -eu

SRC_DIR=$1
WORK=$2

echo "[python] unpacking $(ls "$SRC_DIR"/*.orig.tar.gz)"
rm -rf "$WORK" && mkdir -p "$WORK"
tar -xzf "$SRC_DIR"/*.orig.tar.gz -C "$WORK" --strip-components=1
tar -xJf "$SRC_DIR"/*.debian.tar.xz -C "$WORK"
cd "$WORK"

# Debian's series starts with patches that change the install layout (dist-packages,
# multiarch names, disabled ensurepip); those would break a plain --prefix install. The
# security and crash fixes come after them, starting with the first CVE patch.
echo "[python] applying Debian's security patches"
sed -n '/^CVE-/,$p' debian/patches/series | while read -r patch_name; do
    patch -p1 -s --forward < "debian/patches/$patch_name"
done

# Debian's CVE-2026-4224 patch makes pyexpat.c include an internal header that only compiles
# with Py_BUILD_CORE; Debian builds pyexpat into libpython, a plain build as a shared module.
if grep -q pycore_ceval.h Modules/pyexpat.c; then
    printf '%s\n' '#ifndef Py_BUILD_CORE_BUILTIN' '#  define Py_BUILD_CORE_MODULE 1' '#endif' \
        | cat - Modules/pyexpat.c > Modules/pyexpat.c.new
    mv Modules/pyexpat.c.new Modules/pyexpat.c
fi
