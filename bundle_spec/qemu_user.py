"""Run a program on an emulated CPU with qemu-user, frozen PyInstaller binaries included.

Shared by the build (the aarch64 build runs PyInstaller inside an arm64 root) and the CPU
matrix (bundle_spec/matrix.py, tests, benchmarks/matrix.py). Standard library only, and runnable
by path: the helper process that sets up the namespace is this file itself (`_inside`).

Why not plain `qemu-x86_64 -cpu Nehalem ./decide`: a PyInstaller bootloader re-executes itself
at start, and that exec leaves qemu (the child runs natively on the host CPU). What works is a
private binfmt_misc in a fresh user + mount namespace (kernel >= 6.7): every ELF executable of
the target architecture that the process tree execs goes through qemu, with the CPU model taken
from QEMU_CPU. Nothing is registered on the host, and every mount (binfmt_misc, the chroot's
/proc /sys /dev) dies with the namespace.

- x86_64: only ET_EXEC executables are routed through qemu. qemu itself is a static PIE (ET_DYN),
  so it cannot match its own rule and loop. A PIE program given as argv[0] is started under qemu
  explicitly; PIE helpers it execs (sh, uname) run natively, which does not matter for a probe.
- aarch64: every aarch64 executable is routed (qemu is an x86 binary, so no loop). Dynamically
  linked programs need an arm64 root: `root=` chroots there (see bundle_spec/aarch64), or
  `ld_prefix=` lets qemu find the guest's loader and libc without a chroot.

qemu 10 (bookworm-backports) is required: qemu 7.2 shows the host's x86 /proc/cpuinfo to aarch64
programs (onnxruntime segfaults at import) and computes wrong int8 results with SVE (-cpu max).
`ensure_qemu()` installs it with apt when it is missing.

CLI (from the repository root, or anywhere once the project is installed):
    python3 -m bundle_spec.qemu_user install
    python3 -m bundle_spec.qemu_user run --arch x86_64 --cpu Nehalem -- ./dist/decide/decide info --json
    python3 -m bundle_spec.qemu_user run --arch aarch64 --cpu cortex-a53 --root ROOT -- /bin/uname -m
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

QEMU_MIN_VERSION = (10, 0)
BACKPORTS_SOURCES = Path("/etc/apt/sources.list.d/decide-bookworm-backports.sources")
BACKPORTS_STANZA = """\
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

QEMU_BINARIES = {"x86_64": Path("/usr/bin/qemu-x86_64"), "aarch64": Path("/usr/bin/qemu-aarch64")}

# binfmt_misc rules: ELF64 little-endian, e_machine x86-64 / AArch64.
# x86_64 matches e_type == ET_EXEC only; aarch64 matches ET_EXEC and ET_DYN (mask 0xfe).
_BINFMT_RULES = {
    "x86_64": (
        r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00",
        r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    ),
    "aarch64": (
        r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00",
        r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff",
    ),
}

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
SIGILL_EXIT = -4  # subprocess returncode of a child killed by SIGILL (qemu re-raises it)


class EmulationUnavailable(RuntimeError):
    """qemu or user namespaces are not usable here (tests skip with this message)."""


def qemu_version(arch: str = "x86_64") -> tuple[int, int] | None:
    """(major, minor) of the installed qemu-user for `arch`, or None if not installed."""
    binary = QEMU_BINARIES[arch]
    if not binary.exists():
        return None
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                         check=False).stdout
    match = re.search(r"version (\d+)\.(\d+)", out)
    return (int(match[1]), int(match[2])) if match else None


def _qemu_ok() -> bool:
    versions = [qemu_version(arch) for arch in QEMU_BINARIES]
    return all(v is not None and v >= QEMU_MIN_VERSION for v in versions)


def ensure_qemu(install: bool = True) -> None:
    """Make sure qemu-user >= 10 is installed; apt-install it from bookworm-backports if not.

    Raises EmulationUnavailable when it is missing and cannot be installed (not root, no apt).
    """
    if _qemu_ok():
        return
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EmulationUnavailable(
            "qemu-user >= 10 is not installed (run `python3 -m bundle_spec.qemu_user install` as root)"
        )
    if not BACKPORTS_SOURCES.exists():
        BACKPORTS_SOURCES.write_text(BACKPORTS_STANZA)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "-q", "-o", "Dpkg::Use-Pty=0"]
    for cmd in (
        [*apt, "update"],
        [*apt, "install", "-y", "-t", "bookworm-backports", "qemu-user-static"],
    ):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise EmulationUnavailable(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    if not _qemu_ok():
        raise EmulationUnavailable(f"installed qemu is older than {QEMU_MIN_VERSION}")


def emulated_command(
    argv: Sequence[str],
    arch: str,
    cpu: str,
    root: Path | None = None,
    workdir: Path | None = None,
    ld_prefix: Path | None = None,
) -> list[str]:
    """The host command that runs `argv` on the emulated CPU (see `run_emulated`)."""
    if arch not in QEMU_BINARIES:
        raise ValueError(f"unknown arch {arch!r}")
    cmd = [sys.executable, str(Path(__file__).resolve()), "_inside", "--arch", arch, "--cpu", cpu]
    if root is not None:
        cmd += ["--root", str(root)]
    if workdir is not None:
        cmd += ["--workdir", str(workdir)]
    if ld_prefix is not None:
        cmd += ["--ld-prefix", str(ld_prefix)]
    if arch == "x86_64" and argv and _is_pie(argv[0], root):
        cmd.append("--pie")
    return [*cmd, "--", *argv]


def _is_pie(program: str, root: Path | None) -> bool:
    """True when `program` (a path or a name on PATH) is an x86_64 PIE, which the ET_EXEC-only
    binfmt rule does not route through qemu."""
    # Imported here, in the caller's process: this file also runs by path as the namespace
    # helper (`_inside`), where the bundle_spec package need not be importable.
    from bundle_spec.elf import ET_EXEC, read_elf_info

    path = Path(program) if "/" in program else Path(shutil.which(program) or program)
    if root is not None and path.is_absolute():
        path = root / path.relative_to("/")
    info = read_elf_info(path) if path.is_file() else None
    return info is not None and info.arch == "x86_64" and info.elf_type != ET_EXEC


def run_emulated(
    argv: Sequence[str],
    arch: str,
    cpu: str,
    *,
    root: Path | None = None,
    workdir: Path | None = None,
    ld_prefix: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` with every `arch` executable it starts emulated as CPU model `cpu`.

    `root`: chroot into this directory first (argv and workdir are then paths inside it).
    `ld_prefix`: without a chroot, let qemu look up the guest's /lib… here first (QEMU_LD_PREFIX),
    e.g. an arm64 root for a dynamically linked aarch64 program at a host path. Returns the completed process with
    text stdout/stderr; a SIGILL shows as returncode SIGILL_EXIT.
    """
    ensure_qemu()
    return subprocess.run(
        emulated_command(argv, arch, cpu, root, workdir, ld_prefix),
        env=dict(os.environ if env is None else env),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# ---------------------------------------------------------------------------------------------
# Inside the helper process: namespace, private binfmt_misc, exec.


def _unshare_with_mapped_root() -> None:
    """Enter a new user + mount namespace where we are root.

    The parent stays in the old namespace to write the id maps: as real root it may map the
    first 65536 ids one-to-one (so chown in a chroot works, e.g. apt's _apt user); otherwise only
    our own uid can be mapped to root.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            err = ctypes.get_errno()
            raise EmulationUnavailable(f"unshare(user|mount) failed: {os.strerror(err)}")
        os.write(ready_w, b"1")
        if os.read(mapped_r, 1) != b"1":
            raise EmulationUnavailable("writing the user namespace id maps failed")
        return
    os.read(ready_r, 1)
    ok = b"1"
    try:
        if os.geteuid() == 0:
            maps = {"uid_map": "0 0 65536\n", "gid_map": "0 0 65536\n"}
        else:
            Path(f"/proc/{pid}/setgroups").write_text("deny")
            maps = {"uid_map": f"0 {os.geteuid()} 1\n", "gid_map": f"0 {os.getegid()} 1\n"}
        for name, text in maps.items():
            Path(f"/proc/{pid}/{name}").write_text(text)
    except OSError as exc:
        print(f"qemu_user: cannot map ids: {exc}", file=sys.stderr)
        ok = b"0"
    os.write(mapped_w, ok)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # same death for our caller: re-raise the child's signal
        os.kill(os.getpid(), -code)
    os._exit(code)


def _register_binfmt(arch: str) -> None:
    """Mount a private binfmt_misc and route `arch` ELF executables through qemu (flag F)."""
    binfmt = Path("/proc/sys/fs/binfmt_misc")
    subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt)], check=True)
    magic, mask = _BINFMT_RULES[arch]
    # F: the kernel opens qemu now, so it is found even after a chroot.
    (binfmt / "register").write_text(f":decide-{arch}:M::{magic}:{mask}:{QEMU_BINARIES[arch]}:F")


def _bind_system_dirs(root: Path) -> None:
    """Make /proc, /sys and /dev usable inside the chroot (rbind keeps locked submounts)."""
    for name in ("proc", "sys", "dev"):
        target = root / name
        target.mkdir(exist_ok=True)
        subprocess.run(["mount", "--rbind", f"/{name}", str(target)], check=True)
    resolv = root / "etc/resolv.conf"
    if Path("/etc/resolv.conf").exists() and resolv.parent.is_dir():
        if not resolv.exists() or resolv.is_symlink():
            resolv.unlink(missing_ok=True)
            resolv.touch()
        subprocess.run(["mount", "--bind", "/etc/resolv.conf", str(resolv)], check=True)


def _inside(args: argparse.Namespace) -> None:
    """Entry of the helper: set up the namespace and exec the target (never returns)."""
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise SystemExit("qemu_user: no command given")
    _unshare_with_mapped_root()
    _register_binfmt(args.arch)
    os.environ["QEMU_CPU"] = args.cpu
    if args.ld_prefix:
        os.environ["QEMU_LD_PREFIX"] = str(Path(args.ld_prefix).resolve())
    if args.root:
        root = Path(args.root).resolve()
        _bind_system_dirs(root)
        os.chroot(root)
        os.chdir(args.workdir or "/")
    elif args.workdir:
        os.chdir(args.workdir)
    target = shutil.which(argv[0]) or argv[0]
    if args.pie:
        # A PIE program does not match the x86_64 rule: start it under qemu ourselves.
        argv = [str(QEMU_BINARIES["x86_64"]), "-cpu", args.cpu, target, *argv[1:]]
        target = argv[0]
    sys.stdout.flush()
    os.execv(target, argv)


def main(arguments: Sequence[str] | None = None) -> int:
    """CLI: `install`, or `run --arch A --cpu C [--root DIR] -- command...`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("install", help="apt-install qemu-user >= 10 if missing")
    for name in ("run", "_inside"):
        run = sub.add_parser(name)
        run.add_argument("--arch", choices=sorted(QEMU_BINARIES), required=True)
        run.add_argument("--cpu", required=True, help="QEMU_CPU model, e.g. Nehalem, cortex-a53")
        run.add_argument("--root", help="chroot into this directory (arm64 root)")
        run.add_argument("--workdir", help="working directory (inside the root if given)")
        run.add_argument("--ld-prefix", help="QEMU_LD_PREFIX: guest library root, no chroot")
        run.add_argument("--pie", action="store_true", help=argparse.SUPPRESS)
        run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(arguments)
    if args.action == "install":
        ensure_qemu()
        print(f"qemu {qemu_version()} ready", file=sys.stderr)
        return 0
    if args.action == "_inside":
        _inside(args)
    ensure_qemu()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    root = Path(args.root) if args.root else None
    workdir = Path(args.workdir) if args.workdir else None
    ld_prefix = Path(args.ld_prefix) if args.ld_prefix else None
    cmd = emulated_command(argv, args.arch, args.cpu, root, workdir, ld_prefix)
    code = subprocess.run(cmd, check=False).returncode
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
