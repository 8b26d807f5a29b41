#!/bin/sh
# Compile CPython inside the old-distro build root (called by build.py through chroot).
#
# Usage: build_python.sh SRC_DIR PREFIX
#   SRC_DIR holds Debian's python3.11_*.orig.tar.gz and python3.11_*.debian.tar.xz
#   PREFIX  is where the interpreter is installed (e.g. /opt/py311)
#
# Why compile: the old root's own Python (3.9 on bullseye) is too old for the pinned
# numpy/onnxruntime wheels, and a Python from a newer distro would raise the bundle's glibc
# floor (libpython is copied into the bundle).
set -eu

SRC_DIR=$1
PREFIX=$2
WORK=/build/cpython
JOBS=${JOBS:-2}

sh /build/spec/python_source.sh "$SRC_DIR" "$WORK"
cd "$WORK"

# No test suite (a third of `make install`'s time) and no pip in the prefix: `python -m venv`
# bootstraps pip into the build venv from the ensurepip package, which is still installed.
# Keep the glibc floor down: bind exp/log/pow to their pre-2.29 symbol versions and do not
# use sem_clockwait (glibc 2.30; Python falls back to sem_timedwait). CFLAGS, not CPPFLAGS:
# configure greps the preprocessor's output of CPPFLAGS to find the platform triplet.
echo "[python] configure"
./configure --prefix="$PREFIX" --enable-shared --with-ensurepip=no --disable-test-modules \
    LDFLAGS="-Wl,-rpath,$PREFIX/lib" \
    CFLAGS="-include /build/spec/glibc_floor.h" \
    ac_cv_func_sem_clockwait=no \
    > /build/cpython-configure.log 2>&1 || { tail -30 /build/cpython-configure.log; exit 1; }

echo "[python] make -j$JOBS (a few minutes)"
make -j"$JOBS" > /build/cpython-make.log 2>&1 || { tail -40 /build/cpython-make.log; exit 1; }
make install > /build/cpython-install.log 2>&1 || { tail -40 /build/cpython-install.log; exit 1; }

# Strip here, not in PyInstaller: `pyinstaller --strip` also strips numpy's bundled OpenBLAS,
# which then fails to load ("ELF load command address/offset not properly aligned").
echo "[python] stripping libpython and lib-dynload"
strip --strip-unneeded "$PREFIX"/lib/libpython3*.so.* "$PREFIX"/lib/python3.*/lib-dynload/*.so

"$PREFIX/bin/python3" -c "import ctypes, pyexpat, zlib, bz2, lzma, hashlib, json, ssl; print('[python] built', __import__('sys').version.split()[0])"
