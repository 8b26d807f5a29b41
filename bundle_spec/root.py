"""The Debian 11 build root: where CPython is built against glibc 2.31 and PyInstaller runs.

x86_64 (the host's arch): debootstrap + apt-get in a chroot, all native.
aarch64 on an x86_64 host: nothing here needs an arm64 CPU, so nothing is emulated: the host's
apt resolves and downloads the arm64 packages (private state, the host's lists stay untouched)
and they are unpacked natively with dpkg-deb (no maintainer scripts: what matters here is files —
headers, libraries, a shell). Only `ldconfig` runs emulated, once. Configuring the packages under
qemu (debootstrap's second stage and apt inside the root) took 134 s + 385 s and is not needed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from bundle_spec import qemu_user
from bundle_spec.common import CHROOT_ENV, ROOT_SUITE, Arch, BuildError, Refused, note, run

# Build tools and CPython's build dependencies, in the native (x86_64) root.
NATIVE_ROOT_PACKAGES = (
    "build-essential", "binutils", "file", "xz-utils", "ca-certificates",
    "libssl-dev", "zlib1g-dev", "libffi-dev", "libbz2-dev", "liblzma-dev",
    "libsqlite3-dev", "uuid-dev", "libexpat1-dev",
)
# The extracted arm64 root: the sysroot of the cross-compiled CPython (headers, libraries, start
# files) plus what runs in it under qemu — the shell and ldd that PyInstaller calls.
EXTRACTED_ROOT_PACKAGES = (
    "base-files", "base-passwd", "bash", "dash", "coreutils", "sed", "grep", "libc-bin",
    "libc6-dev", "binutils", "libssl-dev", "zlib1g-dev", "libffi-dev", "libbz2-dev",
    "liblzma-dev", "libsqlite3-dev", "uuid-dev", "libexpat1-dev",
)


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


def root_sources(mirrors: tuple[str, str], arch: Arch | None = None) -> str:
    """sources.list of the build root: bullseye with its updates and security fixes."""
    archive, security = mirrors
    option = f"[arch={arch.debian}] " if arch else ""
    return "\n".join([f"deb {option}{archive} {ROOT_SUITE} main",
                      f"deb {option}{archive} {ROOT_SUITE}-updates main",
                      f"deb {option}{security} {ROOT_SUITE}-security main"]) + "\n"


def private_apt(state: Path, sources: str, arch: Arch | None = None) -> list[str]:
    """The host's apt-get reading only `sources`, with its lists and downloads kept in `state`."""
    for folder in ("lists/partial", "cache/archives/partial"):
        (state / folder).mkdir(parents=True, exist_ok=True)
    (state / "sources.list").write_text(sources)
    (state / "status").touch()  # empty dpkg status: apt resolves every dependency itself
    options = {
        "Dir::Etc::SourceList": f"{state}/sources.list", "Dir::Etc::SourceParts": "/nonexistent",
        "Dir::State": str(state), "Dir::State::Lists": f"{state}/lists",
        "Dir::State::status": f"{state}/status", "Dir::Cache": f"{state}/cache",
        "Debug::NoLocking": "1", "APT::Get::AllowUnauthenticated": "false",
    }
    if arch is not None:
        options |= {"APT::Architecture": arch.debian, "APT::Architectures": arch.debian}
    return ["apt-get", "-q", *(arg for key, value in options.items() for arg in ("-o", f"{key}={value}"))]


class BuildRoot:
    """A Debian root directory plus the stamps that say which cached stages are current."""

    def __init__(self, path: Path, arch: Arch) -> None:
        self.path = path
        self.arch = arch
        self.stamps = path.parent / f"{path.name}.stamps"

    @property
    def emulated(self) -> bool:
        """True when the root's programs run under qemu-user (another arch than the host's)."""
        return self.arch.emulated

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


def _fresh_partial(root: BuildRoot) -> Path:
    """An empty `<root>.partial` directory; the old root and its stamps are gone."""
    partial = root.path.with_name(root.path.name + ".partial")
    unmount_below(root.path)
    unmount_below(partial)
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(root.path, ignore_errors=True)
    root.clear_stamps()
    return partial


def debootstrap(root: BuildRoot, mirror: str, log: Path, nice: int) -> None:
    """debootstrap a minimal bullseye root into root.path (replacing any previous one)."""
    partial = _fresh_partial(root)
    note(f"debootstrap --variant=minbase {ROOT_SUITE} ({root.arch.debian}) → {root.path}")
    run(["nice", "-n", str(nice), "debootstrap", "--variant=minbase", f"--arch={root.arch.debian}",
         ROOT_SUITE, str(partial), mirror], log=log)
    partial.rename(root.path)


def ensure_clean_root(root: BuildRoot, mirror: str, log: Path, nice: int = 10) -> None:
    """A minimal Debian 11 root with nothing added (tests check the bundle runs there); cached."""
    digest = hashlib.sha256(f"{ROOT_SUITE}|{root.arch.debian}|{mirror}".encode()).hexdigest()
    if root.stamp_matches("clean", digest) and (root.path / "usr" / "bin" / "sh").exists():
        return
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise Refused("creating a Debian root needs root and debootstrap")
    debootstrap(root, mirror, log, nice)
    root.write_stamp("clean", digest)


def ensure_native_root(root: BuildRoot, mirrors: tuple[str, str], logs: Path, nice: int) -> None:
    """The cached Debian 11 root with compilers and CPython's build dependencies (x86_64)."""
    sources = root_sources(mirrors)
    digest = hashlib.sha256(f"{ROOT_SUITE}|{sources}|{NATIVE_ROOT_PACKAGES}".encode()).hexdigest()
    if root.stamp_matches("root", digest) and (root.path / "usr" / "bin" / "gcc").exists():
        note(f"reusing {root.path}")
        return
    debootstrap(root, mirrors[0], logs / "root.log", nice)
    (root.path / "etc" / "apt" / "sources.list").write_text(sources)
    shutil.copy("/etc/resolv.conf", root.path / "etc" / "resolv.conf")
    with root.mounted():
        root.chroot(["apt-get", "update", "-q"], logs / "root.log", nice)
        root.chroot(["apt-get", "install", "-y", "-q", "--no-install-recommends", *NATIVE_ROOT_PACKAGES],
                    logs / "root.log", nice)
    root.write_stamp("root", digest)


def ensure_extracted_root(root: BuildRoot, mirrors: tuple[str, str], logs: Path, nice: int) -> None:
    """The cached arm64 Debian 11 root, resolved and unpacked by the host (see the module doc)."""
    sources = root_sources(mirrors, root.arch)
    digest = hashlib.sha256(f"extracted|{sources}|{EXTRACTED_ROOT_PACKAGES}".encode()).hexdigest()
    if root.stamp_matches("root", digest) and (root.path / "usr" / "include" / "stdio.h").exists():
        note(f"reusing {root.path}")
        return
    log = logs / "root.log"
    partial = _fresh_partial(root)
    state = root.path.parent / "apt-root"
    shutil.rmtree(state, ignore_errors=True)
    debs = download_packages(state, sources, root.arch, EXTRACTED_ROOT_PACKAGES, log)
    note(f"unpacking {len(debs)} {root.arch.debian} packages natively into {root.path}")
    partial.mkdir(parents=True)
    for deb in debs:
        unpack_deb(deb, partial)
    finish_extracted_root(partial)
    partial.rename(root.path)
    note("ldconfig (emulated)")
    root.chroot(["/sbin/ldconfig"], log, nice)
    shutil.rmtree(state / "cache", ignore_errors=True)  # the .debs: ~60 MB
    root.write_stamp("root", digest)


def download_packages(state: Path, sources: str, arch: Arch, packages: tuple[str, ...],
                      log: Path) -> list[Path]:
    """Download `packages` and their dependencies for `arch` with the host's apt; returns the .debs."""
    apt = private_apt(state, sources, arch)
    run([*apt, "update"], log=log)
    install = [*apt, "install", "-y", "--download-only", "--no-install-recommends", *packages]
    try:
        run(install, log=log)
    except BuildError:
        # Seen here (2026-11-30): the security index listed arm64 files its pool did not serve
        # (404). Build without it rather than not at all, and say so loudly: libssl, libexpat,
        # liblzma and libsqlite3 from this root end up in the bundle.
        note(f"WARNING: {ROOT_SUITE}-security packages not fetchable; using {ROOT_SUITE} + updates only")
        shutil.rmtree(state / "cache", ignore_errors=True)  # no mix of the two attempts' versions
        private_apt(state, "".join(line + "\n" for line in sources.splitlines()
                                   if "-security" not in line), arch)
        run([*apt, "update"], log=log)
        run(install, log=log)
    return sorted((state / "cache" / "archives").glob("*.deb"))


def unpack_deb(deb: Path, target: Path) -> None:
    """Unpack one .deb's files into `target` and record them where dpkg would (info/<pkg>.list).

    The file list is what the licence step reads to find which package shipped a library.
    """
    package = deb.name.split("_")[0]
    contents = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    listing = subprocess.run(["tar", "-x", "-v", "--keep-directory-symlink", "-C", str(target), "-f", "-"],
                             stdin=contents.stdout, capture_output=True, text=True, check=False)
    contents.stdout.close()  # type: ignore[union-attr]
    if contents.wait() != 0 or listing.returncode != 0:
        raise BuildError(f"unpacking {deb.name} failed: {listing.stderr.strip()[-500:]}")
    info = target / "var" / "lib" / "dpkg" / "info"
    info.mkdir(parents=True, exist_ok=True)
    paths = ["/" + line.removeprefix("./").rstrip("/") for line in listing.stdout.splitlines()]
    (info / f"{package}.list").write_text("\n".join(p if p != "/" else "/." for p in paths) + "\n")


def finish_extracted_root(root: Path) -> None:
    """What maintainer scripts would have done that the build needs: sh, users, relative links."""
    sh = root / "bin" / "sh"
    if (root / "bin" / "dash").exists() and not sh.exists() and not sh.is_symlink():
        sh.symlink_to("dash")  # dash's postinst makes this link
    for name in ("passwd", "group"):
        target, master = root / "etc" / name, root / "usr/share/base-passwd" / f"{name}.master"
        if not target.exists() and master.exists():
            shutil.copy(master, target)
    (root / "tmp").mkdir(mode=0o1777, exist_ok=True)
    # The cross linker resolves symlinks on the host: make the root's absolute ones relative
    # (e.g. usr/lib/aarch64-linux-gnu/libz.so → /lib/aarch64-linux-gnu/libz.so.1.2.11).
    for libdir in sorted((root / "usr" / "lib").glob("*-linux-gnu")):
        for link in libdir.iterdir():
            if link.is_symlink() and os.readlink(link).startswith("/"):
                destination = root / os.readlink(link).lstrip("/")
                link.unlink()
                link.symlink_to(os.path.relpath(destination, link.parent))
