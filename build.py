#!/usr/bin/env python3
"""Build the decide bundle: dist/decide-<version>-linux-<arch>.zip (+ .sha256, + build manifest).

    python3 build.py                 # host architecture (x86_64)
    python3 build.py --arch aarch64  # arm64, built inside an emulated arm64 root (qemu-user)
    python3 build.py --help

Steps, each printed as it runs (long outputs go to build/<arch>/logs/):
  1. host checks      root, debootstrap (installed through apt if missing), the model package
  2. build root       Debian 11 (bullseye, glibc 2.31) via debootstrap, build tools inside  [cached]
  3. python           CPython 3.11 compiled in that root from Debian's source pool           [cached]
  4. wheels           the pinned wheels, downloaded on the host for the target               [cached]
  5. venv             a venv of the compiled Python with exactly those wheels                [cached]
  6. freeze           PyInstaller onedir with bundle_spec/decide.spec, inside the root
  7. assemble         models/, platforms/, README, licences next to the binary
  8. glibc floor      highest GLIBC_ version any ELF in the bundle needs; fails above --max-glibc
  9. smoke test       `decide selftest` on the host
 10. zip              zip with symlinks kept, .sha256, build manifest, size report

Why a Debian 11 root: PyInstaller copies libpython, libstdc++, libffi … from the machine it runs
on, so the bundle needs at least that machine's glibc. Caches live in ~/.cache/decide-build
(--cache); a fresh machine needs only the Debian and PyPI registries. Stdlib only.

aarch64 on an x86_64 host: steps 2-3 are bundle_spec/aarch64/make_root.sh (an arm64 Debian 11
root with a cross-compiled CPython; about 1.5 h the first time, then cached), and every command
"inside the root" runs under qemu-aarch64 through bundle_spec/qemu_user.py (a private binfmt_misc
in a user namespace: no host state changes). Everything else is the same code as for x86_64.
Exit codes: 0 built, 1 build failed, 2 refused (unsupported arch, not root, bad arguments).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import struct
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))
from bundle_spec import qemu_user
from runtime import __version__ as VERSION
from runtime.package import PackageError, load_package, sha256_file, verify_files

DEFAULT_CACHE = Path.home() / ".cache" / "decide-build"
DEFAULT_MODEL = REPO / "models" / "topics-multilingual"
DEFAULT_MAX_GLIBC = "2.28"  # the onnxruntime wheel's own floor; the build root has 2.31

ROOT_SUITE = "bullseye"  # Debian 11, glibc 2.31: the oldest suite debootstrap can still fetch
PYTHON_SOURCE = "python3.11"  # source package, taken from PYTHON_SOURCE_SUITE's pool
PYTHON_SOURCE_SUITE = "bookworm"
PYTHON_PREFIX = "/opt/py311"
ROOT_PACKAGES = (
    "build-essential", "binutils", "file", "xz-utils", "ca-certificates",
    "libssl-dev", "zlib1g-dev", "libffi-dev", "libbz2-dev", "liblzma-dev",
    "libsqlite3-dev", "uuid-dev", "libexpat1-dev",
)
CHROOT_ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
    "PYTHONDONTWRITEBYTECODE": "1",
}


@dataclass(frozen=True)
class Arch:
    """What differs between target architectures."""

    name: str  # as `uname -m` says it
    debian: str  # Debian's name for it
    triplet: str  # multiarch library directory
    wheel_platforms: tuple[str, ...]  # pip --platform tags, newest first
    # The qemu CPU model that runs the root's programs when this is not the host's arch. ARMv8.0
    # without dotprod: the oldest CPU the bundle supports, so the build cannot use more.
    emulated_cpu: str = ""


ARCHES = {
    "x86_64": Arch(
        name="x86_64",
        debian="amd64",
        triplet="x86_64-linux-gnu",
        wheel_platforms=("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                         "manylinux_2_17_x86_64", "manylinux2014_x86_64"),
    ),
    "aarch64": Arch(
        name="aarch64",
        debian="arm64",
        triplet="aarch64-linux-gnu",
        wheel_platforms=("manylinux_2_28_aarch64", "manylinux_2_27_aarch64",
                         "manylinux_2_17_aarch64", "manylinux2014_aarch64"),
        emulated_cpu="cortex-a72",
    ),
}


class BuildError(Exception):
    """A build step failed; the message says which and why."""


class Refused(Exception):
    """The build cannot run here as asked (exit code 2)."""


# ----------------------------------------------------------------------------- progress output

_STARTED = time.monotonic()
_STEP_COUNT = 10


def step(number: int, title: str) -> None:
    """Print the header of a build step."""
    print(f"\n[{number}/{_STEP_COUNT}] {title}  (+{time.monotonic() - _STARTED:.0f}s)", flush=True)


def note(text: str) -> None:
    """Print a line of progress inside a step."""
    print(f"      {text}", flush=True)


def run(cmd: list[str], log: Path | None = None, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> str:
    """Run a command; its output goes to `log` (or is returned); raise BuildError on failure."""
    started = time.monotonic()
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"\n$ {' '.join(cmd)}\n")
            out.flush()
            result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, check=False)
        if result.returncode != 0:
            tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(True)[-25:])
            raise BuildError(f"{cmd[0]} … failed (exit {result.returncode}); end of {log}:\n{tail}")
        note(f"done in {time.monotonic() - started:.0f}s (log: {log})")
        return ""
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if result.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed (exit {result.returncode}): {result.stderr.strip()}")
    return result.stdout


# ----------------------------------------------------------------------------- pins and inputs

def read_pins(requirements: Path) -> dict[str, str]:
    """`name==version` pins of a requirements file, following `-r other.txt` includes."""
    pins: dict[str, str] = {}
    for raw in requirements.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r"):
            pins.update(read_pins(requirements.parent / line[2:].strip()))
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise BuildError(f"{requirements}: '{line}' is not pinned with ==")
        pins[name.strip()] = version.strip()
    return pins


def wheel_prefix(name: str, version: str) -> str:
    """How a wheel file of `name==version` starts (names normalized as wheels spell them)."""
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


def inputs_digest(model_dir: Path = DEFAULT_MODEL) -> str:
    """sha256 over everything that decides the bundle's content (tests reuse a matching build)."""
    paths = [REPO / "build.py", REPO / "requirements.txt", REPO / "requirements-build.txt",
             model_dir / "manifest.json"]
    for folder, pattern in (("bundle_spec", "*"), ("runtime", "*.py"), ("platforms", "*.json")):
        paths += sorted(p for p in (REPO / folder).rglob(pattern) if p.is_file()
                        and "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path).encode())
        digest.update(path.read_bytes() if path.exists() else b"<missing>")
    return digest.hexdigest()


def git_commit() -> str:
    """The repository's HEAD commit, with '+dirty' when tracked files differ from it."""
    try:
        head = run(["git", "-C", str(REPO), "rev-parse", "HEAD"]).strip()
        dirty = run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    except (BuildError, FileNotFoundError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


# ----------------------------------------------------------------------------- the build root

def host_debian_mirrors(apt_dir: Path = Path("/etc/apt")) -> tuple[str, str]:
    """(archive, security) Debian mirror URLs from the host's apt sources, in either format."""
    archive = security = ""
    sources = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file() or path.suffix not in (".list", ".sources", ""):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        entries: list[tuple[str, list[str]]] = []
        if path.suffix == ".sources":
            for block in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", block, re.MULTILINE))
                if "deb" in fields.get("Types", "").split():
                    entries += [(uri, fields.get("Suites", "").split())
                                for uri in fields.get("URIs", "").split()]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line).split()
                if len(words) >= 3 and words[0] == "deb":
                    entries.append((words[1], [words[2]]))
        for uri, suites in entries:
            uri = uri.rstrip("/")
            if uri.endswith("/debian-security") and not security:
                security = uri
            elif uri.endswith("/debian") and not archive and not any("security" in s for s in suites):
                archive = uri
    if not archive or not security:
        raise Refused("cannot find Debian mirrors in the host's apt sources: "
                      "pass --mirror URL/debian and --security-mirror URL/debian-security")
    return archive, security


class BuildRoot:
    """A Debian root directory plus the stamps that say which cached stages are current."""

    def __init__(self, path: Path, arch: Arch) -> None:
        self.path = path
        self.arch = arch
        self.stamps = path.parent / f"{path.name}.stamps"

    @property
    def emulated(self) -> bool:
        """True when the root's programs run under qemu-user (another arch than the host's)."""
        return self.arch.name != platform.machine()

    def stamp_matches(self, stage: str, digest: str) -> bool:
        """True when `stage` was completed with this recipe digest."""
        stamp = self.stamps / f"{stage}.json"
        return stamp.is_file() and json.loads(stamp.read_text())["digest"] == digest

    def stamp_digest(self, stage: str) -> str:
        """The recipe digest a completed stage was made with (later stages depend on it)."""
        return json.loads((self.stamps / f"{stage}.json").read_text())["digest"]

    def stamp_info(self, stage: str) -> dict[str, str]:
        """What a completed stage recorded (e.g. the Python source version)."""
        return json.loads((self.stamps / f"{stage}.json").read_text()).get("info", {})

    def write_stamp(self, stage: str, digest: str, info: dict[str, str] | None = None) -> None:
        """Mark `stage` as completed with this recipe digest."""
        self.stamps.mkdir(parents=True, exist_ok=True)
        (self.stamps / f"{stage}.json").write_text(json.dumps({"digest": digest, "info": info or {}}))

    def clear_stamps(self) -> None:
        """Forget every stage (the root is being recreated)."""
        shutil.rmtree(self.stamps, ignore_errors=True)

    @contextmanager
    def mounted(self) -> Iterator[None]:
        """Bind /proc, /sys, /dev, /dev/pts into the root for the duration of the block.

        An emulated root needs nothing here: qemu_user binds them in its own mount namespace.
        """
        if self.emulated:
            yield
            return
        done: list[Path] = []
        try:
            for name in ("proc", "sys", "dev", "dev/pts"):
                target = self.path / name
                target.mkdir(parents=True, exist_ok=True)
                if not os.path.ismount(target):
                    run(["mount", "--bind", f"/{name}", str(target)])
                    done.append(target)
            yield
        finally:
            for target in reversed(done):
                subprocess.run(["umount", "--lazy", str(target)], check=False)

    def unmount_all(self) -> None:
        """Undo mounts a killed earlier run may have left inside the root."""
        unmount_below(self.path)

    def chroot(self, command: list[str], log: Path, nice: int) -> None:
        """Run a command inside the root (niced: the 2 cores are shared), emulated if need be."""
        if self.emulated:
            inside = qemu_user.emulated_command(command, self.arch.name, self.arch.emulated_cpu,
                                                root=self.path)
        else:
            inside = ["chroot", str(self.path), *command]
        run(["nice", "-n", str(nice), *inside], log=log, env=CHROOT_ENV)


def hold_build_lock(path: Path) -> IO[str]:
    """Wait until no other build.py uses this root, then hold the lock while the file stays open.

    Two builds in one root would rebuild and delete each other's stages (e.g. /opt/py311).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = open(path, "w", encoding="utf-8")  # noqa: SIM115 (the caller keeps it open)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        note(f"another build.py is using {path.parent}: waiting for it")
        fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def unmount_below(path: Path) -> None:
    """Unmount everything mounted below `path`; raise if anything stays mounted.

    Must succeed before a root is deleted: rmtree would otherwise descend into the host's
    /dev, /proc and /sys through the bind mounts (ours, or debootstrap's if it was killed).
    """
    def mounts() -> list[str]:
        points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        return sorted((m for m in points if m.startswith(f"{path}/")), reverse=True)

    for target in mounts():
        subprocess.run(["umount", "--lazy", target], check=False)
    if mounts():
        raise BuildError(f"cannot unmount {mounts()}; not deleting {path}")


def make_root(root: BuildRoot, suite: str, mirror: str, log: Path, nice: int) -> None:
    """debootstrap a minimal `suite` root into root.path (replacing any previous one)."""
    partial = root.path.with_name(root.path.name + ".partial")
    root.unmount_all()
    unmount_below(partial)
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(root.path, ignore_errors=True)
    root.clear_stamps()
    note(f"debootstrap --variant=minbase {suite} ({root.arch.debian}) → {root.path}")
    run(["nice", "-n", str(nice), "debootstrap", "--variant=minbase", f"--arch={root.arch.debian}",
         suite, str(partial), mirror], log=log)
    partial.rename(root.path)


def ensure_clean_root(root: BuildRoot, mirror: str, log: Path, nice: int = 10) -> None:
    """A minimal Debian 11 root with nothing added (tests check the bundle runs there); cached."""
    digest = hashlib.sha256(f"{ROOT_SUITE}|{root.arch.debian}|{mirror}".encode()).hexdigest()
    if root.stamp_matches("clean", digest) and (root.path / "usr" / "bin" / "sh").exists():
        return
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise Refused("creating a Debian root needs root and debootstrap")
    make_root(root, ROOT_SUITE, mirror, log, nice)
    root.write_stamp("clean", digest)


def ensure_build_root(root: BuildRoot, mirrors: tuple[str, str], logs: Path, nice: int) -> None:
    """The cached Debian 11 build root with compilers and CPython's build dependencies."""
    archive, security = mirrors
    sources = "\n".join([
        f"deb {archive} {ROOT_SUITE} main",
        f"deb {archive} {ROOT_SUITE}-updates main",
        f"deb {security} {ROOT_SUITE}-security main",
        # Source only: CPython 3.11 is compiled from the newer suite's pool, never installed.
        f"deb-src {archive} {PYTHON_SOURCE_SUITE} main",
        f"deb-src {security} {PYTHON_SOURCE_SUITE}-security main",
    ]) + "\n"
    digest = hashlib.sha256(f"{ROOT_SUITE}|{sources}|{ROOT_PACKAGES}".encode()).hexdigest()
    if root.stamp_matches("root", digest) and (root.path / "usr" / "bin" / "gcc").exists():
        note(f"reusing {root.path}")
        return
    make_root(root, ROOT_SUITE, archive, logs / "root.log", nice)
    (root.path / "etc" / "apt" / "sources.list").write_text(sources)
    shutil.copy("/etc/resolv.conf", root.path / "etc" / "resolv.conf")
    with root.mounted():
        root.chroot(["apt-get", "update", "-q"], logs / "root.log", nice)
        root.chroot(["apt-get", "install", "-y", "-q", "--no-install-recommends", *ROOT_PACKAGES],
                    logs / "root.log", nice)
    root.write_stamp("root", digest)


def fetch_python_source(root: BuildRoot, log: Path, nice: int) -> str:
    """Download the newest fetchable python3.11 source (orig + Debian patches) into /build/pysrc."""
    source_dir = root.path / "build" / "pysrc"
    shutil.rmtree(source_dir, ignore_errors=True)
    source_dir.mkdir(parents=True)
    root.chroot(["apt-get", "update", "-q"], log, nice)
    listing = subprocess.run(["chroot", str(root.path), "apt-cache", "showsrc", PYTHON_SOURCE],
                             capture_output=True, text=True, env=CHROOT_ENV, check=False).stdout
    versions = sorted(set(re.findall(r"^Version: (\S+)$", listing, re.MULTILINE)),
                      key=_debian_version_key, reverse=True)
    if not versions:
        raise BuildError(f"no {PYTHON_SOURCE} source package in the root's deb-src lines")
    # The security pool's newest index entry can precede its files (seen: 404), so fall back.
    for version in versions:
        fetch = subprocess.run(
            ["chroot", str(root.path), "sh", "-c",
             f"cd /build/pysrc && apt-get source --download-only {PYTHON_SOURCE}={version}"],
            capture_output=True, text=True, env=CHROOT_ENV, check=False)
        if fetch.returncode == 0:
            note(f"{PYTHON_SOURCE} {version} source fetched")
            for leftover in source_dir.glob("*.dsc"):
                leftover.unlink()
            return version
        note(f"{PYTHON_SOURCE} {version}: not downloadable, trying an older one")
        for partial in source_dir.iterdir():
            partial.unlink()
    raise BuildError(f"none of the {PYTHON_SOURCE} source versions {versions} could be downloaded")


def _debian_version_key(version: str) -> list[tuple[int, object]]:
    """Sort key good enough for Debian revisions of one upstream version (3.11.2-6+deb12u9)."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", version)]


def ensure_python(root: BuildRoot, logs: Path, nice: int) -> str:
    """CPython compiled inside the root by bundle_spec/build_python.sh; returns its source version."""
    recipe = [REPO / "bundle_spec" / name for name in ("build_python.sh", "python_source.sh", "glibc_floor.h")]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in recipe) + PYTHON_PREFIX.encode()).hexdigest()
    if root.stamp_matches("python", digest) and (root.path / PYTHON_PREFIX.lstrip("/")).is_dir():
        version = root.stamp_info("python")["source"]
        note(f"reusing {PYTHON_PREFIX} (from {PYTHON_SOURCE} {version})")
        return version
    spec_dir = root.path / "build" / "spec"
    spec_dir.mkdir(parents=True, exist_ok=True)
    for path in recipe:
        shutil.copy(path, spec_dir / path.name)
    shutil.rmtree(root.path / PYTHON_PREFIX.lstrip("/"), ignore_errors=True)
    with root.mounted():
        version = fetch_python_source(root, logs / "python.log", nice)
        note("compiling CPython (about 5 minutes on 2 idle cores; 11-16 on a busy machine)")
        root.chroot(["sh", "/build/spec/build_python.sh", "/build/pysrc", PYTHON_PREFIX],
                    logs / "python.log", nice)
    shutil.rmtree(root.path / "build" / "cpython", ignore_errors=True)  # 500 MB of objects
    root.write_stamp("python", digest, {"source": version})
    return version


MAKE_ARM64_ROOT = REPO / "bundle_spec" / "aarch64" / "make_root.sh"
ARM64_ROOT_STEPS = ("host_tools", "first_stage", "second_stage", "root_packages", "python_source",
                    "cross_python", "python_check", "pip_packages", "smoke")  # make_root.sh's


def ensure_arm64_root(root: BuildRoot, nice: int) -> None:
    """Step 2 for aarch64: the root with its cross-compiled CPython, made by make_root.sh (cached by it)."""
    cache = root.path.parent
    missing = [name for name in ARM64_ROOT_STEPS if not (cache / f"done.{name}").exists()]
    if missing:
        note(f"running {MAKE_ARM64_ROOT.relative_to(REPO)} (steps {', '.join(missing)}): "
             "about 1.5 h the first time (debootstrap + apt under qemu, cross-compiled CPython)")
        env = {**os.environ, "DECIDE_AARCH64_CACHE": str(cache), "NICE": str(nice)}
        if subprocess.run(["bash", str(MAKE_ARM64_ROOT)], env=env, check=False).returncode != 0:
            raise BuildError(f"{MAKE_ARM64_ROOT.name} failed (logs: {cache}/*.log)")
    else:
        note(f"reusing {root.path} (made by {MAKE_ARM64_ROOT.relative_to(REPO)})")


def arm64_python(root: BuildRoot) -> str:
    """Step 3 for aarch64: the Python source version make_root.sh built, and the "python" stamp.

    The stamp is keyed by the libpython that was built, so the venv is rebuilt exactly when the
    interpreter changed.
    """
    cache = root.path.parent
    libpython = root.path / PYTHON_PREFIX.lstrip("/") / "lib" / "libpython3.11.so.1.0"
    patches = sorted((cache / "pysrc").glob(f"{PYTHON_SOURCE}_*.debian.tar.xz"))
    if not libpython.is_file() or not patches:
        raise BuildError(f"{root.path} has no {libpython.name} or {cache}/pysrc has no Debian "
                         f"source: rerun with FORCE=1 {MAKE_ARM64_ROOT.relative_to(REPO)}")
    version = patches[-1].name.removeprefix(f"{PYTHON_SOURCE}_").removesuffix(".debian.tar.xz")
    digest = sha256_file(libpython)
    if not root.stamp_matches("python", digest):
        root.write_stamp("python", digest, {"source": version})
    note(f"{PYTHON_PREFIX}: CPython from {PYTHON_SOURCE} {version}, cross-compiled")
    return version


# ----------------------------------------------------------------------------- wheels and venv

def ensure_wheels(arch: Arch, pins: dict[str, str], wheel_dir: Path, logs: Path) -> list[Path]:
    """One wheel per pin for the target, downloaded by the host's pip unless already cached."""
    wheel_dir.mkdir(parents=True, exist_ok=True)

    def cached(name: str, version: str) -> Path | None:
        prefix = wheel_prefix(name, version)
        return next((p for p in sorted(wheel_dir.glob("*.whl")) if p.name.lower().startswith(prefix)), None)

    missing = [f"{n}=={v}" for n, v in pins.items() if cached(n, v) is None]
    if missing:
        note(f"downloading {len(missing)} wheels: {' '.join(missing)}")
        platforms = [arg for tag in (*arch.wheel_platforms, "any") for arg in ("--platform", tag)]
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.11", "--implementation", "cp",
             "--abi", "cp311", "--abi", "abi3", "--abi", "none", *platforms,
             "--dest", str(wheel_dir), *missing], log=logs / "wheels.log")
    wheels = []
    for name, version in pins.items():
        wheel = cached(name, version)
        if wheel is None:
            raise BuildError(f"pip did not deliver a wheel for {name}=={version} ({arch.name})")
        wheels.append(wheel)
        note(f"{wheel.name}  {wheel.stat().st_size / 1e6:.1f} MB")
    return wheels


def ensure_venv(root: BuildRoot, wheels: list[Path], python_digest: str, logs: Path,
                nice: int) -> None:
    """/build/venv in the root: the compiled Python plus exactly the pinned wheels (no deps).

    --no-deps on purpose: tokenizers declares huggingface-hub and onnxruntime declares
    protobuf/sympy, none of which the runtime imports; leaving them out keeps them out of
    the bundle.
    """
    digest = hashlib.sha256("|".join([python_digest, *(w.name for w in wheels)]).encode()).hexdigest()
    venv = root.path / "build" / "venv"
    if root.stamp_matches("venv", digest) and (venv / "bin" / "pyinstaller").exists():
        note("reusing /build/venv")
        return
    shutil.rmtree(venv, ignore_errors=True)
    inbox = root.path / "build" / "wheels"
    shutil.rmtree(inbox, ignore_errors=True)
    inbox.mkdir(parents=True)
    for wheel in wheels:
        shutil.copy(wheel, inbox / wheel.name)
    with root.mounted():
        root.chroot([f"{PYTHON_PREFIX}/bin/python3", "-m", "venv", "/build/venv"], logs / "venv.log", nice)
        # --no-compile: PyInstaller compiles what it ships; byte-compiling here costs minutes under qemu.
        root.chroot(["/build/venv/bin/python", "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                     *(f"/build/wheels/{w.name}" for w in wheels)], logs / "venv.log", nice)
    root.write_stamp("venv", digest)


# ----------------------------------------------------------------------------- freeze + assemble

def freeze(root: BuildRoot, logs: Path, nice: int) -> Path:
    """Run PyInstaller on bundle_spec/decide.spec inside the root; returns the onedir (in the root)."""
    src = root.path / "build" / "src"
    shutil.rmtree(src, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("runtime", "bundle_spec"):
        shutil.copytree(REPO / folder, src / folder, ignore=ignore)
    for leftover in ("dist", "work"):
        shutil.rmtree(root.path / "build" / leftover, ignore_errors=True)
    with root.mounted():
        root.chroot(["/build/venv/bin/pyinstaller", "--noconfirm", "--clean",
                     "--distpath", "/build/dist", "--workpath", "/build/work",
                     "/build/src/bundle_spec/decide.spec"], logs / "pyinstaller.log", nice)
    onedir = root.path / "build" / "dist" / "decide"
    strip_binaries(root, onedir, logs / "strip.log", nice)
    return onedir


def strip_binaries(root: BuildRoot, onedir: Path, log: Path, nice: int) -> None:
    """strip --strip-unneeded the libraries that still carry symbols, with the root's binutils.

    Not PyInstaller's --strip: it also strips auditwheel's vendored libraries (`<pkg>.libs/`,
    rewritten by patchelf), and numpy's OpenBLAS then fails to load ("ELF load command
    address/offset not properly aligned"). The executable itself is skipped too: PyInstaller
    appends its archive to it.
    """
    candidates = [p for p in sorted(onedir.rglob("*"))
                  if p.is_file() and not p.is_symlink() and p != onedir / "decide"
                  and not any(part.endswith(".libs") for part in p.relative_to(onedir).parts)
                  and elf_has_symbol_table(p)]
    if not candidates:
        note("nothing to strip")
        return
    before = sum(p.stat().st_size for p in candidates)
    root.chroot(["strip", "--strip-unneeded", *(f"/{p.relative_to(root.path)}" for p in candidates)], log, nice)
    saved = before - sum(p.stat().st_size for p in candidates)
    note(f"stripped {len(candidates)} libraries: -{saved / 1e6:.1f} MB "
         f"({', '.join(p.name for p in candidates[:4])}{' …' if len(candidates) > 4 else ''})")


def copy_model(model_dir: Path, target: Path) -> dict[str, object]:
    """Copy the files the model manifest names (verified) into target; returns a summary."""
    try:
        package = load_package(model_dir)
        manifest = package.manifest
        entries = [manifest.tokenizer, *([manifest.golden] if manifest.golden else [])]
        for variant in manifest.variants.values():
            entries += variant.files()
        verify_files(package, entries)
    except PackageError as exc:
        raise BuildError(f"model package {model_dir}: {exc}") from exc
    precisions = {v.precision for v in manifest.variants.values()}
    if not {"fp32", "int8"} <= precisions:
        raise BuildError(f"model {manifest.name} must carry an fp32 and an int8 variant, has {precisions}")
    target.mkdir(parents=True)
    names = {"manifest.json", *(e.file for e in entries)}
    names |= {p.name for p in model_dir.iterdir() if re.match(r"(LICEN[CS]E|NOTICE|README)", p.name, re.IGNORECASE)}
    for name in sorted(names):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model_dir / name, target / name)
        (target / name).chmod(0o644)  # the factory may write 0600 files; the box is read by anyone
    return {
        "name": manifest.name,
        "version": manifest.version,
        "variants": {
            v.name: {"precision": v.precision, "file": v.file.file, "sha256": v.file.sha256,
                     "bytes": sum(f.bytes for f in v.files())}
            for v in manifest.variants.values()
        },
    }


def dpkg_file_owners(root: Path) -> dict[str, str]:
    """Installed path → Debian package, read from dpkg's file lists (what `dpkg -S` searches).

    Read directly rather than by running dpkg in the root: that is an arm64 program in the
    aarch64 root, one qemu start per lookup.
    """
    owners: dict[str, str] = {}
    for listing in sorted((root / "var" / "lib" / "dpkg" / "info").glob("*.list")):
        package = listing.stem.split(":")[0]  # libssl1.1:arm64.list → libssl1.1
        for line in listing.read_text(encoding="utf-8", errors="replace").splitlines():
            owners.setdefault(line, package)
    return owners


def collect_licences(root: BuildRoot, bundle: Path, model_dir: Path, log: Path) -> list[str]:
    """Put the licence of everything the bundle ships under bundle/licenses; returns its index."""
    out = bundle / "licenses"
    out.mkdir()
    index: list[str] = []
    python_licence = root.path / PYTHON_PREFIX.lstrip("/") / "lib" / "python3.11" / "LICENSE.txt"
    shutil.copy(python_licence, out / "CPython-LICENSE.txt")
    index.append("CPython-LICENSE.txt: the Python interpreter and standard library")
    site = next((root.path / "build" / "venv" / "lib").glob("python3*/site-packages"))
    for dist_info in sorted(site.glob("*.dist-info")):
        if dist_info.name.startswith(("pip-", "setuptools-", "altgraph-", "packaging-",
                                      "pyinstaller_hooks_contrib-")):
            continue  # build tools: not shipped (PyInstaller's own bootloader licence is kept)
        dist = dist_info.name.removesuffix(".dist-info")
        # RECORD lists every installed file: licence texts may sit in the package folder too
        # (onnxruntime/LICENSE, ThirdPartyNotices.txt) or as an SBOM (tokenizers' Rust crates).
        record = (dist_info / "RECORD").read_text(encoding="utf-8").splitlines()
        names = [line.split(",")[0] for line in record]
        wanted = [site / name for name in names
                  if re.match(r"(LICEN[CS]E|COPYING|NOTICE|ThirdPartyNotices|AUTHORS)", Path(name).name, re.IGNORECASE)
                  or "/sboms/" in name]
        for path in wanted:
            target = out / dist / path.relative_to(site)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
        metadata = (dist_info / "METADATA").read_text(encoding="utf-8", errors="replace")
        declared = re.findall(r"^(License(?:-Expression)?: .*|Classifier: License :: .*)$", metadata, re.MULTILINE)
        (out / dist).mkdir(exist_ok=True)
        (out / dist / "LICENSE-METADATA.txt").write_text("\n".join(declared) + "\n")
        if not any("LICEN" in p.name.upper() for p in wanted) and "Apache" in " ".join(declared):
            # tokenizers' wheel declares Apache-2.0 but carries no text; Apache-2.0 asks for one.
            shutil.copy(root.path / "usr/share/common-licenses/Apache-2.0", out / dist / "LICENSE-Apache-2.0.txt")
        index.append(f"{dist}/: Python package ({'; '.join(declared) or 'see files'}), {len(wanted)} licence files")
    # Shared libraries PyInstaller copied from the Debian root: ship their Debian copyright.
    owners = dpkg_file_owners(root.path)
    packages: set[str] = set()
    for lib in sorted((bundle / "_internal").glob("*.so*")):
        # Merged /usr: dpkg knows a library under the directory its package installed it to.
        for libdir in (f"/lib/{root.arch.triplet}", f"/usr/lib/{root.arch.triplet}"):
            if f"{libdir}/{lib.name}" in owners:
                packages.add(owners[f"{libdir}/{lib.name}"])
                break
    for package in sorted(packages):
        copyright_file = root.path / "usr" / "share" / "doc" / package / "copyright"
        if copyright_file.is_file():
            (out / "debian").mkdir(exist_ok=True)
            shutil.copy(copyright_file, out / "debian" / f"{package}.copyright")
            index.append(f"debian/{package}.copyright: shared library from Debian 11 ({package})")
    with open(log, "a", encoding="utf-8") as fh:
        fh.write("licences:\n" + "\n".join(index) + "\n")
    for path in model_dir.iterdir():
        if re.match(r"(LICEN[CS]E|NOTICE)", path.name, re.IGNORECASE):
            shutil.copy(path, out / f"model-{path.name}")
            index.append(f"model-{path.name}: the embedded model")
    provenance = load_package(model_dir).manifest.provenance  # base model, data sets, their licences
    (out / "model-provenance.json").write_text(json.dumps(provenance, indent=2, ensure_ascii=False) + "\n")
    index.append("model-provenance.json: where the embedded model and its training data come from")
    (out / "README.txt").write_text("Licences of what this bundle ships\n\n" + "\n".join(index) + "\n")
    return index


def assemble(onedir: Path, staging: Path, model_dir: Path, root: BuildRoot,
             logs: Path) -> dict[str, object]:
    """Copy the frozen app to `staging` and add models/, platforms/, README and licences."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(onedir, staging, symlinks=True)
    model = copy_model(model_dir, staging / "models" / model_dir.name)
    note(f"model {model['name']} {model['version']}: variants {', '.join(model['variants'])}")
    (staging / "platforms").mkdir()
    for tier_file in sorted((REPO / "platforms").glob("*.json")):
        shutil.copy(tier_file, staging / "platforms" / tier_file.name)
    shutil.copy(REPO / "bundle_spec" / "README.box.md", staging / "README.md")
    index = collect_licences(root, staging, model_dir, logs / "assemble.log")
    note(f"licences: {len(index)} entries in licenses/README.txt")
    return model


def add_legacy_stack(arch: Arch, staging: Path, cache: Path, logs: Path, smoke: bool) -> None:
    """Unpack numpy 1.26.4 into _internal/legacy when a tier of platforms/<arch>.json needs it.

    CPUs below x86-64-v2 cannot run numpy 2.4; runtime/stack.py puts this directory first on
    sys.path for those tiers (same onnxruntime). Left out: tests, f2py, distutils, C headers and
    static libraries, type stubs, and the SIMD test module _simd (0.6 MB zipped, imported by
    numpy's tests only). The modules are byte-compiled (unchecked-hash: zip timestamps cannot
    invalidate them), since a frozen app never writes bytecode and a Core 2 would otherwise
    compile numpy at every start.
    """
    from runtime.stack import LEGACY_DIR, LEGACY_NUMPY

    tiers = json.loads((REPO / "platforms" / f"{arch.name}.json").read_text(encoding="utf-8"))["tiers"]
    legacy_tiers = [t["name"] for t in tiers if t.get("numeric_stack") == "legacy"]
    if not legacy_tiers:
        return
    name, _, version = LEGACY_NUMPY.partition("==")
    (wheel,) = ensure_wheels(arch, {name: version}, cache / "wheels" / f"{arch.name}-legacy", logs)
    target = staging / "_internal" / LEGACY_DIR
    skipped = re.compile(r"numpy/((.*/)?tests/|f2py/|distutils/|_pyinstaller/|core/include/|core/lib/"
                         r"|random/lib/|random/_examples/|core/_simd\.)|.*\.(pyi|pxd)$")
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if not skipped.match(m)]
        archive.extractall(target, members)
    for path in target.rglob("*.so*"):
        path.chmod(0o755)  # zipfile drops the mode bits
    if sys.version_info[:2] == (3, 11):  # same bytecode as the bundle's CPython 3.11
        import compileall
        import py_compile

        compileall.compile_dir(target, quiet=1, workers=0,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    else:
        note(f"not byte-compiled (host Python is {sys.version.split()[0]}, the bundle's is 3.11)")
    licences = staging / "licenses" / f"{name}-{version}-legacy"
    licences.mkdir(parents=True, exist_ok=True)
    for licence in target.glob(f"{name}-{version}.dist-info/LICENSE*"):
        shutil.copy(licence, licences / licence.name)
    with open(staging / "licenses" / "README.txt", "a", encoding="utf-8") as index:
        index.write(f"{licences.name}/: {name} {version}, the legacy numeric stack (BSD-3-Clause; "
                    "its OpenBLAS and gfortran runtime licences are in the same file)\n")
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    note(f"legacy stack for tier {', '.join(legacy_tiers)}: {name} {version} in _internal/{LEGACY_DIR} "
         f"({size / 1e6:.1f} MB unpacked)")
    if smoke:  # the frozen app must import this numpy, not the one in its PYZ
        run([str(staging / "decide"), "selftest", "--tier", legacy_tiers[0]], log=logs / "smoke-legacy.log")


# ----------------------------------------------------------------------------- glibc floor

SHT_SYMTAB = 2
SHT_GNU_VERNEED = 0x6FFFFFFE
Section = tuple[int, int, int, int, int, int, int, int, int, int]  # Elf64_Shdr fields


def read_elf(path: Path) -> tuple[bytes, list[Section]] | None:
    """File bytes and section headers of a 64-bit little-endian ELF (x86_64, aarch64); None if not ELF."""
    with open(path, "rb") as fh:
        if fh.read(4) != b"\x7fELF":
            return None
        data = b"\x7fELF" + fh.read()
    if data[4] != 2 or data[5] != 1:
        raise BuildError(f"{path}: not a 64-bit little-endian ELF")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return data, [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]


def elf_needed_versions(path: Path) -> set[str] | None:
    """Symbol versions an ELF file needs (GLIBC_2.28, GLIBCXX_3.4.22 …); None if not ELF.

    Walks the .gnu.version_r section (Elf64_Verneed entries and their Elf64_Vernaux names).
    """
    elf = read_elf(path)
    if elf is None:
        return None
    data, sections = elf
    needed: set[str] = set()
    for _name, kind, _flags, _addr, offset, _size, link, count, _align, _entsize in sections:
        if kind != SHT_GNU_VERNEED:
            continue
        strings = sections[link][4]
        entry = offset
        for _ in range(count):
            _version, aux_count, _file, aux, next_entry = struct.unpack_from("<HHIII", data, entry)
            aux_at = entry + aux
            for _ in range(aux_count):
                _hash, _aux_flags, _other, name, next_aux = struct.unpack_from("<IHHII", data, aux_at)
                end = data.index(b"\0", strings + name)
                needed.add(data[strings + name:end].decode())
                aux_at += next_aux
            entry += next_entry
    return needed


def elf_has_symbol_table(path: Path) -> bool:
    """True for an ELF file that still carries a full symbol table (i.e. not stripped)."""
    elf = read_elf(path)
    return elf is not None and any(section[1] == SHT_SYMTAB for section in elf[1])


def version_tuple(text: str) -> tuple[int, ...]:
    """'2.28' → (2, 28)."""
    return tuple(int(part) for part in text.split("."))


def glibc_floor(bundle: Path) -> dict[str, object]:
    """Highest GLIBC_ / GLIBCXX_ / CXXABI_ version any ELF in the bundle needs, and who needs it."""
    highest: dict[str, tuple[tuple[int, ...], str]] = {}
    elf_count = 0
    for path in sorted(bundle.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        needed = elf_needed_versions(path)
        if needed is None:
            continue
        elf_count += 1
        for symbol_version in needed:
            match = re.fullmatch(r"(GLIBC|GLIBCXX|CXXABI)_([\d.]+)", symbol_version)
            if not match:
                continue  # GLIBC_PRIVATE, library-specific versions (OPENSSL_1_1_0 …)
            family, number = match.group(1), version_tuple(match.group(2))
            if family not in highest or number > highest[family][0]:
                highest[family] = (number, str(path.relative_to(bundle)))
    return {
        "elf_files": elf_count,
        **{family.lower(): ".".join(map(str, number)) for family, (number, _) in highest.items()},
        "set_by": {family.lower(): who for family, (_, who) in highest.items()},
    }


# ----------------------------------------------------------------------------- zip and report

def write_zip(staging: Path, zip_path: Path) -> None:
    """Zip `staging` as a top-level folder, storing symlinks as symlinks (like `zip -y`)."""
    base = staging.parent
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for path in sorted(staging.rglob("*")):
            name = str(path.relative_to(base))
            if path.is_symlink():
                info = zipfile.ZipInfo(name, time.localtime(path.lstat().st_mtime)[:6])
                info.create_system = 3  # unix, so unzip honours the mode bits below
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                archive.writestr(info, os.readlink(path))
            elif path.is_file():
                archive.write(path, name)
            elif path.is_dir() and not any(path.iterdir()):
                archive.write(path, name + "/")


def bundle_part(relative: tuple[str, ...]) -> str:
    """Which part of the bundle a file belongs to, for the size report."""
    if relative[0] != "_internal":
        return relative[0]  # decide (bootloader + Python code), models, platforms, licenses …
    if len(relative) > 2:
        return relative[1] + ("/lib-dynload (stdlib extension modules)" if relative[1].startswith("python3") else "/")
    if ".so" in relative[1]:
        return "shared libraries (libpython, libstdc++, libffi …)"
    return relative[1]


def size_report(bundle: Path) -> dict[str, object]:
    """Unpacked size, the 10 largest files and the size of each part of the bundle."""
    files = [p for p in bundle.rglob("*") if p.is_file() and not p.is_symlink()]
    parts: dict[str, int] = {}
    for path in files:
        part = bundle_part(path.relative_to(bundle).parts)
        parts[part] = parts.get(part, 0) + path.stat().st_size
    largest = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:10]
    return {
        "unpacked_bytes": sum(parts.values()),
        "top_files": [[str(p.relative_to(bundle)), p.stat().st_size] for p in largest],
        "parts": dict(sorted(parts.items(), key=lambda item: item[1], reverse=True)),
    }


def installed_versions(root: BuildRoot) -> dict[str, str]:
    """Versions of the packages in the root's venv, from their dist-info folder names."""
    site = next((root.path / "build" / "venv" / "lib").glob("python3*/site-packages"))
    versions = {}
    for dist_info in site.glob("*.dist-info"):
        name, _, version = dist_info.name.removesuffix(".dist-info").partition("-")
        versions[name] = version
    return dict(sorted(versions.items()))


def smoke_test(staging: Path, root: BuildRoot, log: Path) -> None:
    """Run `decide selftest` from the staging folder: the build fails if the frozen app does.

    Emulated: under qemu with the root's glibc (QEMU_LD_PREFIX), on the arch's oldest CPU model.
    """
    command = [str(staging / "decide"), "selftest"]
    if root.emulated:
        command = qemu_user.emulated_command(command, root.arch.name, root.arch.emulated_cpu,
                                             ld_prefix=root.path)
    run(command, log=log)


# ----------------------------------------------------------------------------- main

def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options (all have working defaults)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default=platform.machine(), help="target architecture (default: host)")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="model package to embed")
    parser.add_argument("--max-glibc", default=DEFAULT_MAX_GLIBC,
                        help="fail if any ELF needs a newer glibc (default %(default)s)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="cache folder (default %(default)s)")
    parser.add_argument("--dist", type=Path, default=REPO / "dist", help="output folder (default %(default)s)")
    parser.add_argument("--mirror", help="Debian archive URL (default: from the host's apt sources)")
    parser.add_argument("--security-mirror", help="Debian security URL (default: host's apt sources)")
    parser.add_argument("--nice", type=int, default=10, help="niceness of the heavy steps (default 10)")
    parser.add_argument("--no-smoke", action="store_true", help="skip `decide selftest` after building")
    return parser.parse_args(argv)


def check_host(args: argparse.Namespace) -> Arch:
    """Step 1: refuse early and clearly when this machine cannot build what was asked."""
    arch = ARCHES.get(args.arch)
    if arch is None:
        raise Refused(f"unknown --arch {args.arch!r}; known: {', '.join(ARCHES)}")
    if arch.name != platform.machine():
        if not arch.emulated_cpu or platform.machine() != "x86_64":
            raise Refused(f"building {arch.name} on {platform.machine()} is not supported")
        try:
            qemu_user.ensure_qemu()
        except qemu_user.EmulationUnavailable as exc:
            raise Refused(f"building {arch.name} here needs qemu-user: {exc}") from exc
    if os.geteuid() != 0:
        raise Refused("debootstrap, chroot and mount need root: run build.py as root")
    if shutil.which("debootstrap") is None:
        if shutil.which("apt-get") is None:
            raise Refused("debootstrap is missing and there is no apt-get to install it")
        note("installing debootstrap with apt-get")
        run(["apt-get", "update", "-q"])
        run(["apt-get", "install", "-y", "-q", "debootstrap"])
    if not (args.model / "manifest.json").is_file():
        raise Refused(f"no model package at {args.model} (manifest.json missing): "
                      "build it with the factory in models/ first, or pass --model DIR")
    note(f"arch {arch.name}, model {args.model}, max glibc {args.max_glibc}, cache {args.cache}")
    return arch


def build(args: argparse.Namespace) -> dict[str, object]:
    """All steps; returns the build manifest (also written next to the zip)."""
    step(1, "host checks")
    arch = check_host(args)
    _lock = hold_build_lock(args.cache / arch.name / "build.lock")  # released when build() returns
    mirrors = (args.mirror, args.security_mirror) if args.mirror and args.security_mirror \
        else host_debian_mirrors()
    logs = REPO / "build" / arch.name / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    root = BuildRoot(args.cache / arch.name / "root", arch)

    if root.emulated:
        step(2, f"build root: Debian {ROOT_SUITE} ({arch.debian}, runs as qemu {arch.emulated_cpu})")
        ensure_arm64_root(root, args.nice)

        step(3, f"python: CPython 3.11 cross-compiled for the root ({PYTHON_PREFIX})")
        python_source = arm64_python(root)
    else:
        step(2, f"build root: Debian {ROOT_SUITE} ({arch.debian})")
        ensure_build_root(root, mirrors, logs, args.nice)

        step(3, f"python: CPython 3.11 compiled in the root ({PYTHON_PREFIX})")
        python_source = ensure_python(root, logs, args.nice)

    step(4, "wheels: pinned in requirements-build.txt (+ requirements.txt)")
    pins = read_pins(REPO / "requirements-build.txt")
    wheels = ensure_wheels(arch, pins, args.cache / "wheels" / arch.name, logs)

    step(5, "venv: compiled Python + exactly those wheels")
    ensure_venv(root, wheels, root.stamp_digest("python"), logs, args.nice)

    step(6, "freeze: PyInstaller onedir (bundle_spec/decide.spec)")
    onedir = freeze(root, logs, args.nice)

    step(7, "assemble: models/, platforms/, README, licences")
    staging = REPO / "build" / arch.name / "decide"
    model = assemble(onedir, staging, args.model, root, logs)
    add_legacy_stack(arch, staging, args.cache, logs, smoke=not args.no_smoke)

    step(8, f"glibc floor (must be ≤ {args.max_glibc})")
    floor = glibc_floor(staging)
    note(f"{floor['elf_files']} ELF files; GLIBC_{floor.get('glibc')} (set by {floor['set_by'].get('glibc')}), "
         f"GLIBCXX_{floor.get('glibcxx')}, CXXABI_{floor.get('cxxabi')}")
    if version_tuple(str(floor["glibc"])) > version_tuple(args.max_glibc):
        raise BuildError(f"glibc floor {floor['glibc']} is above --max-glibc {args.max_glibc} "
                         f"({floor['set_by']['glibc']} needs it)")

    versions = installed_versions(root)
    build_info = {
        "name": "decide", "version": VERSION, "arch": arch.name, "commit": git_commit(),
        "inputs_digest": inputs_digest(args.model), "root": f"debian {ROOT_SUITE}",
        "python": f"3.11 ({PYTHON_SOURCE} {python_source})",
        "packages": {name: versions.get(re.sub(r"[-.]", "_", name), "?") for name in read_pins(REPO / "requirements.txt")},
        "model": model, "glibc_floor": floor,
    }
    (staging / "build-info.json").write_text(json.dumps(build_info, indent=2) + "\n")

    step(9, "smoke test: decide selftest")
    if args.no_smoke:
        note("skipped (--no-smoke)")
    else:
        smoke_test(staging, root, logs / "smoke.log")

    step(10, "zip")
    args.dist.mkdir(parents=True, exist_ok=True)
    stem = f"decide-{VERSION}-linux-{arch.name}"
    zip_path = args.dist / f"{stem}.zip"
    write_zip(staging, zip_path)
    digest = sha256_file(zip_path)
    (args.dist / f"{stem}.zip.sha256").write_text(f"{digest}  {zip_path.name}\n")
    sizes = size_report(staging)
    manifest = {**build_info, "zip": zip_path.name, "zip_bytes": zip_path.stat().st_size,
                "zip_sha256": digest, **sizes, "build_seconds": round(time.monotonic() - _STARTED, 1)}
    (args.dist / f"{stem}.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print_report(manifest, zip_path)
    return manifest


def print_report(manifest: dict[str, object], zip_path: Path) -> None:
    """The closing summary: what each part costs, the largest files, the result line."""
    print("\n      size by part (unpacked):")
    for part, size in manifest["parts"].items():  # type: ignore[union-attr]
        print(f"        {size / 1e6:7.1f} MB  {part}")
    print("      largest files:")
    for name, size in manifest["top_files"]:  # type: ignore[union-attr]
        print(f"        {size / 1e6:7.1f} MB  {name}")
    print(f"      unpacked {manifest['unpacked_bytes'] / 1e6:.1f} MB, built in {manifest['build_seconds']:.0f}s\n")
    print(f"{zip_path.relative_to(REPO) if zip_path.is_relative_to(REPO) else zip_path}  "
          f"({manifest['zip_bytes'] / 1e6:.1f} MB)  glibc floor {manifest['glibc_floor']['glibc']}  "  # type: ignore[index]
          f"sha256 {manifest['zip_sha256']}")


def main(argv: list[str]) -> int:
    """Entry point; returns the process exit code."""
    args = parse_args(argv)
    try:
        build(args)
    except Refused as exc:
        print(f"build.py: refused: {exc}", file=sys.stderr)
        return 2
    except BuildError as exc:
        print(f"build.py: failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
