"""What a process tree tried to do outside what decide owns, read from an strace log (issue 33).

`traced(argv)` is the command under `strace -f`, with every syscall that creates, changes or
removes a path and every socket address a process connects or sends to. `violations(log, ...)`
turns the log into one line per attempt — successful or not — that either reaches a non-loopback
network address (or a name service: nscd, systemd-resolved), or creates / writes / removes a path
outside the allowed directories. An attempt counts even when it failed: a DNS look-up that found
no route or a write HOME refused is still decide trying.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

SYSCALLS = ("connect", "sendto", "sendmsg", "bind", "open", "openat", "creat", "mkdir", "mkdirat", "rename",
            "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat", "unlink", "unlinkat", "truncate")
# Paths any process may touch: devices, the kernel's views.
SYSTEM_PREFIXES = ("/dev/", "/proc/", "/sys/")
_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<call>\w+)\((?P<args>.*?)(?:\) += |<unfinished|$)")
_WRITE_FLAGS = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def strace() -> str | None:
    """The strace binary, installing it first when this process may (root, Debian); None if not."""
    found = shutil.which("strace")
    if found is None and Path("/usr/bin/apt-get").exists() and _is_root():
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "strace"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600, check=False)
        found = shutil.which("strace")
    return found


def _is_root() -> bool:
    import os

    return os.geteuid() == 0


def traced(binary: str, argv: list[str], log: Path) -> list[str]:
    """argv under strace: every process and thread, file descriptors shown with their paths."""
    return [binary, "-f", "-qq", "-y", "-s", "512", "-o", str(log), "-e", "trace=" + ",".join(SYSCALLS), *argv]


def _unescape(text: str) -> str:
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode(
        "utf-8", "replace")


def _paths(call: str, args: str, cwd: Path) -> list[str]:
    """The absolute paths a file syscall names (relative ones resolved against cwd or the fd)."""
    strings = [_unescape(s) for s in _STRING.findall(args)]
    if call in ("openat", "mkdirat", "unlinkat", "renameat", "renameat2", "linkat", "symlinkat"):
        # dirfd "AT_FDCWD" or "N</its/path>" precedes each path argument
        # strace -y prints a dirfd with its path: AT_FDCWD</cwd> or 7</some/dir>
        parts = re.findall(r'(AT_FDCWD(?:<[^>]*>)?|\d+<[^>]*>|-?\d+)\s*,\s*"((?:[^"\\]|\\.)*)"', args)
        result = []
        for dirfd, raw in parts:
            path = _unescape(raw)
            where = re.search(r"<([^>]*)>", dirfd)
            if path.startswith("/"):
                result.append(path)
            elif where:
                result.append(str(Path(where.group(1)) / path))
            else:
                result.append(str(cwd / path))
        if call == "symlinkat" and strings:  # its target is a string, not a place written
            result = result[-1:]
        return result
    if call == "symlink":
        strings = strings[1:]
    return [s if s.startswith("/") else str(cwd / s) for s in strings]


def _writes(call: str, args: str) -> bool:
    if call in ("open", "openat"):
        return any(flag in args for flag in _WRITE_FLAGS)
    return True


def _network(args: str, allowed_sockets: tuple[str, ...]) -> str | None:
    """Why a connect/sendto/bind address is not allowed (None: loopback, netlink, an allowed socket)."""
    if "sa_family=AF_INET6" in args:
        address = re.search(r'inet_pton\(AF_INET6, "([^"]+)"', args)
        if address and address.group(1) in ("::1", "::ffff:127.0.0.1"):
            return None
        return f"network address {address.group(1) if address else '?'}"
    if "sa_family=AF_INET" in args:
        address = re.search(r'inet_addr\("([^"]+)"\)', args)
        if address and address.group(1).startswith("127."):
            return None
        return f"network address {address.group(1) if address else '?'}"
    if "sa_family=AF_UNIX" in args:
        path = re.search(r'sun_path="((?:[^"\\]|\\.)*)"', args)
        where = _unescape(path.group(1)) if path else ""
        if where.startswith("@") or any(where.startswith(a) for a in allowed_sockets):
            return None  # an abstract socket of the process tree, or the service's own socket
        if where:
            return f"unix socket {where}"
    return None


def violations(log: Path, cwd: Path, allowed: tuple[Path, ...], allowed_pycache: tuple[Path, ...] = ()) -> list[str]:
    """Every attempt in the strace log to use the network or to write outside `allowed`
    (directories), `SYSTEM_PREFIXES`, and `__pycache__` folders below `allowed_pycache`."""
    allowed_dirs = tuple(str(p.resolve()) + "/" for p in allowed)
    pycache_roots = tuple(str(p.resolve()) + "/" for p in allowed_pycache)
    found: list[str] = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        call, args = match.group("call"), match.group("args")
        if call in ("connect", "sendto", "sendmsg", "bind"):
            why = _network(args, allowed_dirs)
            if why:
                found.append(f"{call}: {why}  [{line.strip()[:200]}]")
            continue
        if not _writes(call, args):
            continue
        for path in _paths(call, args, cwd):
            normal = str(Path(path).resolve(strict=False)) if path.startswith("/") else path
            if normal.startswith(SYSTEM_PREFIXES) or (normal + "/").startswith(allowed_dirs) or \
                    normal.startswith(allowed_dirs):
                continue
            if "/__pycache__/" in normal + "/" and normal.startswith(pycache_roots):
                continue
            found.append(f"{call}: {normal}  [{line.strip()[:200]}]")
    return found
