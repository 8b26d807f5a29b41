"""CPython 3.11 for the bundle, from Debian's source pool with its security patches.

x86_64: compiled inside the native root (bundle_spec/build_python.sh). aarch64: cross-compiled on
the host with Debian's aarch64 gcc against the extracted root as sysroot (natively ~2-3 min;
under qemu it would take tens of minutes). Either way the result is checked on the target CPU:
every extension module in lib-dynload imports, and none that the bundle needs is missing — a
module setup.py skipped or linked wrongly (e.g. _ctypes without libffi) fails the build here,
naming the module, instead of the frozen app at a user's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from bundle_spec import qemu_user
from bundle_spec.common import (
    CHROOT_ENV,
    PYTHON_PREFIX,
    PYTHON_SOURCE,
    PYTHON_SOURCE_SUITE,
    REPO,
    BuildError,
    note,
    run,
)
from bundle_spec.root import BuildRoot, private_apt

SPEC = REPO / "bundle_spec"
RECIPE = [SPEC / name for name in ("build_python.sh", "python_source.sh", "glibc_floor.h", "python.py")]
# Extension modules the bundle or its packages import; they must exist (configure skips a module
# silently when a header is missing) besides importing.
REQUIRED_MODULES = ("_ctypes", "_ssl", "_hashlib", "zlib", "_bz2", "_lzma", "_sqlite3", "_uuid",
                    "pyexpat", "_decimal", "_json", "math", "select", "_socket", "binascii",
                    "unicodedata", "_multiprocessing", "mmap", "_struct", "array",
                    "_posixsubprocess", "_queue", "fcntl", "_pickle", "_datetime", "_statistics")
CHECK_SCRIPT = """\
import importlib, json, pathlib, sys, sysconfig
dynload = pathlib.Path(sysconfig.get_path("platstdlib")) / "lib-dynload"
names = sorted(p.name.split(".")[0] for p in dynload.glob("*.so"))
failed = {}
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
present = set(names) | set(sys.builtin_module_names)
print(json.dumps({"version": sys.version.split()[0], "modules": names, "failed": failed,
                  "missing": sorted(set(sys.argv[1].split(",")) - present)}))
"""


def fetch_python_source(target: Path, mirrors: tuple[str, str], log: Path) -> str:
    """Download the newest fetchable python3.11 source (orig + Debian patches) into `target`.

    With the host's apt and a private state dir (deb-src of bookworm and bookworm-security).
    """
    archive, security = mirrors
    state = target.parent / "apt-src"
    shutil.rmtree(state, ignore_errors=True)
    apt = private_apt(state, f"deb-src {archive} {PYTHON_SOURCE_SUITE} main\n"
                             f"deb-src {security} {PYTHON_SOURCE_SUITE}-security main\n")
    run([*apt, "update"], log=log)
    listing = run(["apt-cache", *apt[2:], "showsrc", PYTHON_SOURCE])
    versions = sorted(set(re.findall(r"^Version: (\S+)$", listing, re.MULTILINE)),
                      key=debian_version_key, reverse=True)
    if not versions:
        raise BuildError(f"no {PYTHON_SOURCE} source package in {PYTHON_SOURCE_SUITE}'s deb-src")
    # The security pool's newest index entry can precede its files (seen: 404), so fall back.
    for version in versions:
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        fetch = subprocess.run([*apt, "source", "--download-only", f"{PYTHON_SOURCE}={version}"],
                               cwd=target, capture_output=True, text=True, check=False)
        if fetch.returncode == 0:
            note(f"{PYTHON_SOURCE} {version} source fetched")
            return version
        note(f"{PYTHON_SOURCE} {version}: not downloadable, trying an older one")
    raise BuildError(f"none of the {PYTHON_SOURCE} source versions {versions} could be downloaded")


def debian_version_key(version: str) -> list[tuple[int, object]]:
    """Sort key good enough for Debian revisions of one upstream version (3.11.2-6+deb12u9)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", version)]


def ensure_python(root: BuildRoot, mirrors: tuple[str, str], logs: Path, nice: int) -> str:
    """CPython in root/opt/py311, built unless the cached one matches the recipe; returns its source version."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in RECIPE) + PYTHON_PREFIX.encode()
                            + root.stamp_digest("root").encode()).hexdigest()
    prefix = root.path / PYTHON_PREFIX.lstrip("/")
    if root.stamp_matches("python", digest) and prefix.is_dir():
        version = root.stamp_info("python")["source"]
        note(f"reusing {PYTHON_PREFIX} (from {PYTHON_SOURCE} {version})")
        return version
    shutil.rmtree(prefix, ignore_errors=True)
    source = root.path.parent / "pysrc"
    version = fetch_python_source(source, mirrors, logs / "python.log")
    if root.emulated:
        note("cross-compiling CPython natively (about 3 minutes on 2 cores)")
        cross_compile(root, source, logs / "python.log", nice)
    else:
        note("compiling CPython in the root (about 5 minutes on 2 idle cores; 11-16 on a busy machine)")
        compile_in_root(root, source, logs / "python.log", nice)
    check_extension_modules(root, root.arch.emulated_cpu, logs / "python.log")
    root.write_stamp("python", digest, {"source": version})
    return version


def compile_in_root(root: BuildRoot, source: Path, log: Path, nice: int) -> None:
    """build_python.sh inside the native root (configure, make, install, strip)."""
    spec_dir, inbox = root.path / "build" / "spec", root.path / "build" / "pysrc"
    for folder in (spec_dir, inbox):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    for path in RECIPE:
        shutil.copy(path, spec_dir / path.name)
    for path in source.glob(f"{PYTHON_SOURCE}_*"):
        shutil.copy(path, inbox / path.name)
    with root.mounted():
        root.chroot(["sh", "/build/spec/build_python.sh", "/build/pysrc", PYTHON_PREFIX], log, nice)
    shutil.rmtree(root.path / "build" / "cpython", ignore_errors=True)  # 500 MB of objects


def build_python_for_cross() -> str:
    """A host python3.11: a cross build of CPython runs one of the same version for its tools."""
    for candidate in ("/usr/bin/python3.11", shutil.which("python3.11"), sys.executable):
        if candidate and Path(candidate).exists():
            done = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                                  capture_output=True, text=True, check=False)
            if done.stdout.strip() == "(3, 11)":
                return candidate
    raise BuildError("cross-compiling CPython 3.11 needs a python3.11 on the host (apt-get install python3.11)")


def cross_compile(root: BuildRoot, source: Path, log: Path, nice: int) -> None:
    """Configure, make and install CPython for root.arch with the host's cross gcc, root as sysroot."""
    triplet, sysroot = root.arch.triplet, root.path
    multiarch = sysroot / "usr" / "lib" / triplet
    # setup.py looks for ffi.h where libffi.pc's includedir says (/usr/include); Debian puts it
    # in the multiarch dir, and without it _ctypes links without -lffi ("undefined symbol:
    # ffi_type_void" at import). FACTS.md, checked by check_extension_modules.
    for header in ("ffi.h", "ffitarget.h"):
        link = sysroot / "usr" / "include" / header
        if not link.exists() and (sysroot / "usr" / "include" / triplet / header).exists():
            link.symlink_to(f"{triplet}/{header}")
    work = root.path.parent / "cpython"
    run(["sh", str(SPEC / "python_source.sh"), str(source), str(work)], log=log)
    # Debian's cross gcc searches its own glibc 2.36 (libc6-dev-arm64-cross) BEFORE the sysroot,
    # for headers, crt1.o and libc.so alike: that would raise the floor to 2.34+. So: no default
    # include dirs, and the root's lib dir first for start files (-B) and libraries (-L).
    # The -L is repeated in LDFLAGS: setup.py looks for libraries only in LDFLAGS' dirs.
    gcc_include = run([f"{triplet}-gcc", "-print-file-name=include"]).strip()
    cc = (f"{triplet}-gcc --sysroot={sysroot} -nostdinc -isystem {gcc_include}"
          f" -isystem {sysroot}/usr/include/{triplet} -isystem {sysroot}/usr/include"
          f" -B{multiarch}/ -L{multiarch} -L{sysroot}/lib/{triplet}")
    env = {**os.environ, "PKG_CONFIG_SYSROOT_DIR": str(sysroot),
           "PKG_CONFIG_LIBDIR": f"{multiarch}/pkgconfig:{sysroot}/usr/share/pkgconfig"}
    # configure cannot run test programs when cross-compiling: the ac_cv_* answers below are
    # the ones a native arm64 glibc build finds.
    run(["./configure", f"--host={triplet}", "--build=x86_64-pc-linux-gnu",
         f"--with-build-python={build_python_for_cross()}", f"--prefix={PYTHON_PREFIX}",
         "--enable-shared", "--with-ensurepip=no", "--disable-test-modules", f"CC={cc}",
         f"CFLAGS=-include {SPEC / 'glibc_floor.h'}", f"LDFLAGS=-L{multiarch} -Wl,-rpath,{PYTHON_PREFIX}/lib",
         f"READELF={triplet}-readelf", "ac_cv_file__dev_ptmx=yes", "ac_cv_file__dev_ptc=no",
         "ac_cv_buggy_getaddrinfo=no", "ac_cv_func_sem_clockwait=no"], log=log, env=env, cwd=work)
    run(["nice", "-n", str(nice), "make", f"-j{os.cpu_count() or 2}"], log=log, env=env, cwd=work)
    run(["make", "install", f"DESTDIR={sysroot}"], log=log, env=env, cwd=work)
    # Strip here, not in PyInstaller (--strip breaks numpy's OpenBLAS, FACTS.md).
    prefix = sysroot / PYTHON_PREFIX.lstrip("/")
    libraries = [*prefix.glob("lib/libpython3*.so.*"), *prefix.glob("lib/python3.11/lib-dynload/*.so")]
    run([f"{triplet}-strip", "--strip-unneeded", *map(str, libraries)], log=log)
    shutil.rmtree(work, ignore_errors=True)  # 500 MB of objects


def check_extension_modules(root: BuildRoot, cpu: str, log: Path) -> dict[str, object]:
    """Import every lib-dynload module of the root's CPython on `cpu` (emulated for another arch).

    Raises BuildError naming each module that fails to import or is missing; returns the report.
    """
    command = [f"{PYTHON_PREFIX}/bin/python3", "-c", CHECK_SCRIPT, ",".join(REQUIRED_MODULES)]
    if root.emulated:
        command = qemu_user.emulated_command(command, root.arch.name, cpu, root=root.path)
    else:
        command = ["chroot", str(root.path), *command]
    with root.mounted():
        output = run(command, env=CHROOT_ENV)
    report = json.loads(output.strip().splitlines()[-1])
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"extension modules on {cpu or 'the host CPU'}: {json.dumps(report)}\n")
    if report["failed"] or report["missing"]:
        problems = [f"{name}: {error}" for name, error in report["failed"].items()]
        problems += [f"{name}: not built" for name in report["missing"]]
        raise BuildError(f"CPython in {root.path} is incomplete on {cpu or 'this CPU'}:\n  "
                         + "\n  ".join(problems))
    note(f"CPython {report['version']}: all {len(report['modules'])} extension modules import"
         f"{f' on emulated {cpu}' if root.emulated else ''}")
    return report
