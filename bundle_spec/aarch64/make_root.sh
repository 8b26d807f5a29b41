#!/bin/bash
# Make the arm64 build root: Debian 11 (glibc 2.31, same floor rule as x86_64) + CPython 3.11
# in /opt/py311 + the runtime pins and PyInstaller, ready for an aarch64 PyInstaller build.
#
# Usage: bundle_spec/aarch64/make_root.sh          (as root; idempotent, each step cached)
#   DECIDE_AARCH64_CACHE  cache dir (default ~/.cache/decide-build/aarch64); the root is $CACHE/root
#   FORCE=1               redo every step
#
# Run a command in the finished root (emulated arm64 CPU, private binfmt_misc, no host state):
#   python3 bundle_spec/qemu_user.py run --arch aarch64 --cpu cortex-a72 --root ~/.cache/decide-build/aarch64/root -- /opt/py311/bin/python3 -V
#
# Why each step is done where it is:
# - debootstrap's second stage, apt and pip run INSIDE the root under qemu-aarch64 (they must).
# - CPython is CROSS-compiled natively with Debian's aarch64 cross gcc against the root as
#   sysroot: compiling it under qemu-user takes tens of minutes on 2 cores, natively ~2-3 min.
#   Linking against the root's glibc 2.31 keeps the floor; bundle_spec/glibc_floor.h binds
#   exp/log/pow to their old symbol versions as on x86_64.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${DECIDE_AARCH64_CACHE:-$HOME/.cache/decide-build/aarch64}
ROOT=$CACHE/root
PREFIX=/opt/py311
SUITE=bullseye
MIRROR=http://deb.debian.org/debian
SECURITY=http://deb.debian.org/debian-security
PYTHON_SUITE=bookworm  # CPython 3.11 source (with Debian's security patches) comes from here
NICE=${NICE:-15}
JOBS=${JOBS:-2}
EMU=(nice -n "$NICE" python3 "$REPO/bundle_spec/qemu_user.py" run --arch aarch64 --cpu cortex-a72 --root "$ROOT" --)
ROOT_PACKAGES=(ca-certificates binutils libc6-dev libssl-dev zlib1g-dev libffi-dev libbz2-dev
               liblzma-dev libsqlite3-dev uuid-dev libexpat1-dev zip)

mkdir -p "$CACHE"
[ "${FORCE:-0}" = 1 ] && rm -f "$CACHE"/done.*

# step NAME FUNCTION: run once (marker file), log to $CACHE/NAME.log, print the time it took.
step() {
    local name=$1 started
    shift
    if [ -e "$CACHE/done.$name" ]; then
        echo "[aarch64] $name: cached ($(cat "$CACHE/done.$name"))"
        return
    fi
    echo "[aarch64] $name ..."
    local status
    started=$(date +%s)
    # A subshell outside any `if`, so that `set -e` stays in force inside the step.
    set +e
    (set -e; "$@") > "$CACHE/$name.log" 2>&1
    status=$?
    set -e
    if [ "$status" != 0 ]; then
        tail -40 "$CACHE/$name.log"
        echo "[aarch64] $name FAILED (log: $CACHE/$name.log)" >&2
        exit 1
    fi
    echo "$(( $(date +%s) - started )) s" > "$CACHE/done.$name"
    echo "[aarch64] $name: $(cat "$CACHE/done.$name")"
}

host_tools() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends debootstrap gcc-aarch64-linux-gnu \
        binutils-aarch64-linux-gnu make pkg-config patch xz-utils python3.11
    python3 "$REPO/bundle_spec/qemu_user.py" install  # qemu-user >= 10 from bookworm-backports
}

first_stage() {
    rm -rf "$ROOT"
    nice -n "$NICE" debootstrap --foreign --arch=arm64 --variant=minbase "$SUITE" "$ROOT" "$MIRROR"
}

second_stage() {
    # In a user namespace mknod is not allowed; /dev is bind-mounted from the host instead, and
    # container=lxc is how debootstrap is told not to create device nodes.
    "${EMU[@]}" /usr/bin/env container=lxc /debootstrap/debootstrap --second-stage
}

root_packages() {
    printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
        "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" "$SECURITY" "$SUITE" > "$ROOT/etc/apt/sources.list"
    # Outgoing TLS here may be re-signed by a local CA: trust what the host trusts (FACTS.md).
    mkdir -p "$ROOT/usr/local/share/ca-certificates"
    cp -a /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/" || true
    local apt=("${EMU[@]}" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get -q)
    "${apt[@]}" update
    if ! "${apt[@]}" install -y --no-install-recommends "${ROOT_PACKAGES[@]}"; then
        # Seen here (2026-11-30): the security index lists arm64 files its pool does not
        # serve (404). Build without it rather than not at all, and say so loudly: libssl,
        # libexpat, liblzma and libsqlite3 from this root end up in the aarch64 bundle.
        echo "WARNING: $SUITE-security arm64 packages not fetchable; using $SUITE + updates only" >&2
        sed -i '/-security/d' "$ROOT/etc/apt/sources.list"
        "${apt[@]}" update
        "${apt[@]}" install -y --no-install-recommends "${ROOT_PACKAGES[@]}"
    fi
    "${EMU[@]}" /usr/sbin/update-ca-certificates
    # The cross linker resolves symlinks on the host: make the root's absolute ones relative.
    find "$ROOT/usr/lib/aarch64-linux-gnu" -maxdepth 1 -type l -lname '/*' | while read -r link; do
        ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$ROOT$(readlink "$link")")" "$link"
    done
}

python_source() {
    # Debian's pool, located through a private apt state dir (the host's apt lists stay as they are).
    local state=$CACHE/apt-src
    rm -rf "$state" "$CACHE/pysrc" && mkdir -p "$state/lists/partial" "$CACHE/pysrc"
    printf 'deb-src %s %s main\ndeb-src %s %s-security main\n' \
        "$MIRROR" "$PYTHON_SUITE" "$SECURITY" "$PYTHON_SUITE" > "$state/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
                -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache")
    apt-get "${opts[@]}" update -q
    # Newest version first; the security pool can list a version before its files are there.
    local version
    for version in $(apt-cache "${opts[@]}" showsrc python3.11 | sed -n 's/^Version: //p' | sort -rV | uniq); do
        if (cd "$CACHE/pysrc" && apt-get "${opts[@]}" source --download-only "python3.11=$version"); then
            return 0
        fi
        rm -f "$CACHE"/pysrc/*
    done
    return 1
}

cross_python() {
    local src=$CACHE/cpython
    # The same source treatment as the x86_64 build: Debian's security patches without its layout patches.
    sh "$REPO/bundle_spec/python_source.sh" "$CACHE/pysrc" "$src"
    cd "$src"
    # Debian's cross gcc searches its own glibc 2.36 (libc6-dev-arm64-cross) BEFORE the sysroot,
    # for headers, crt1.o and libc.so alike: that would raise the floor to 2.34+. So: no default
    # include dirs, and the root's lib dir first for start files (-B) and libraries (-L).
    # The -L is repeated in LDFLAGS: setup.py looks for libffi only in LDFLAGS' dirs (else
    # _ctypes is linked without -lffi: "undefined symbol: ffi_type_void").
    local gcc_include multiarch=$ROOT/usr/lib/aarch64-linux-gnu
    gcc_include=$(aarch64-linux-gnu-gcc -print-file-name=include)
    local cc="aarch64-linux-gnu-gcc --sysroot=$ROOT -nostdinc -isystem $gcc_include"
    cc+=" -isystem $ROOT/usr/include/aarch64-linux-gnu -isystem $ROOT/usr/include"
    cc+=" -B$multiarch/ -L$multiarch -L$ROOT/lib/aarch64-linux-gnu"
    export PKG_CONFIG_SYSROOT_DIR=$ROOT
    export PKG_CONFIG_LIBDIR=$ROOT/usr/lib/aarch64-linux-gnu/pkgconfig:$ROOT/usr/share/pkgconfig
    # configure cannot run test programs when cross-compiling: the ac_cv_* answers below are
    # the ones a native arm64 glibc build finds.
    ./configure --host=aarch64-linux-gnu --build=x86_64-pc-linux-gnu \
        --with-build-python=/usr/bin/python3.11 \
        --prefix="$PREFIX" --enable-shared --with-ensurepip=no \
        CC="$cc" \
        CFLAGS="-include $REPO/bundle_spec/glibc_floor.h" \
        LDFLAGS="-L$multiarch -Wl,-rpath,$PREFIX/lib" \
        READELF=aarch64-linux-gnu-readelf \
        ac_cv_file__dev_ptmx=yes ac_cv_file__dev_ptc=no ac_cv_buggy_getaddrinfo=no \
        ac_cv_func_sem_clockwait=no
    nice -n "$NICE" make -j"$JOBS"
    make install DESTDIR="$ROOT"
    # Strip here, not in PyInstaller (--strip breaks numpy's OpenBLAS, FACTS.md).
    aarch64-linux-gnu-strip --strip-unneeded "$ROOT$PREFIX"/lib/libpython3*.so.* \
        "$ROOT$PREFIX"/lib/python3.11/lib-dynload/*.so
}

python_check() {
    "${EMU[@]}" "$PREFIX/bin/python3" -c \
        "import ctypes, pyexpat, zlib, bz2, lzma, hashlib, json, ssl, sqlite3, uuid; import sys; print(sys.version)"
    "${EMU[@]}" "$PREFIX/bin/python3" -m ensurepip --default-pip
}

pip_packages() {
    mkdir -p "$ROOT/build"
    cp "$REPO/requirements.txt" "$ROOT/build/requirements.txt"
    local pyinstaller
    pyinstaller=$(grep -h '^pyinstaller==' "$REPO"/requirements-*.txt | head -1)
    "${EMU[@]}" /usr/bin/env PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "$PREFIX/bin/python3" -m pip install --only-binary=:all: -r /build/requirements.txt "$pyinstaller"
}

smoke() {
    "${EMU[@]}" "$PREFIX/bin/python3" -c \
        "import numpy, onnxruntime, tokenizers, cpuinfo, PyInstaller; print('numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__, 'pyinstaller', PyInstaller.__version__)"
    # glibc floor of what we compiled: the highest GLIBC_x.y symbol version libpython needs.
    aarch64-linux-gnu-objdump -T "$ROOT$PREFIX"/lib/libpython3.11.so.1.0 \
        | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
}

step host_tools host_tools
step first_stage first_stage
step second_stage second_stage
step root_packages root_packages
step python_source python_source
step cross_python cross_python
step python_check python_check
step pip_packages pip_packages
step smoke smoke
tail -2 "$CACHE/smoke.log"
echo "[aarch64] root ready: $ROOT ($PREFIX/bin/python3)"
