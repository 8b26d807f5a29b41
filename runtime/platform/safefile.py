"""Files that must be regular files inside one directory: no symbolic link on the way, no FIFO or
device, a size cap. The model package and the platform tables are read only through here.

Stdlib only (used before the CPU check). `open_inside` walks the relative path one component at
a time from the directory's fd with O_NOFOLLOW, so a symlink anywhere on the way is refused, never
followed (and no message can say what it points at or how big that is); the file itself is opened
O_NONBLOCK (a FIFO cannot hang the open) and judged by fstat on the opened fd, so nothing can be
swapped between the check and the read. `read_inside` stops at its cap, so a file that grows
while it is read (or a /dev/zero behind a name) cannot grow memory. Issue 23 found each of these
holes in the package checks.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

READ_BLOCK = 1 << 20
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileRefused(Exception):
    """A file that is not a regular file inside the directory, or larger than allowed. The message
    starts with the file's relative path and never describes a symlink's target."""


def kind(mode: int) -> str:
    """What a non-regular file is, for messages: "a FIFO", "a character device", …"""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_dir(path: os.PathLike[str] | str) -> int:
    """The directory's fd. The directory itself may be reached through a symlink (the user's
    choice, e.g. models/current → models/v2); nothing below it may. Raises OSError."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _refused(relative: str, dir_fd: int, name: str) -> FileRefused:
    """Why `name` (in dir_fd) could not be opened with O_NOFOLLOW: lstat only, never the target."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError as exc:
        return FileRefused(f"{relative}: {exc.strerror or exc}")
    return FileRefused(f"{relative} is {kind(mode)}, not a regular file")


def open_subdir(dir_fd: int, name: str, relative: str) -> int:
    """A subdirectory's fd, refusing a symlink; FileNotFoundError if it is missing."""
    try:
        return os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refused(relative, dir_fd, name) from None
        raise FileRefused(f"{relative}: {exc.strerror or exc}") from None


@contextmanager
def open_inside(dir_fd: int, relative: str) -> Iterator[tuple[int, os.stat_result]]:
    """(fd, fstat) of the regular file `relative` below dir_fd, closed on exit. Raises
    FileNotFoundError when it does not exist, FileRefused for anything that is not a regular file
    reached without a symlink."""
    parts = relative.split("/")
    fds: list[int] = []
    try:
        current = dir_fd
        for index, part in enumerate(parts[:-1]):
            current = open_subdir(current, part, "/".join(parts[:index + 1]))
            fds.append(current)
        # lstat first: a device or FIFO is refused without being opened (opening one can have
        # effects); fstat after the open is what counts (the name may change in between).
        if not stat.S_ISREG(os.stat(parts[-1], dir_fd=current, follow_symlinks=False).st_mode):
            raise _refused(relative, current, parts[-1])
        try:
            fd = os.open(parts[-1], _OPEN_FILE, dir_fd=current)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # symlink, directory, socket
                raise _refused(relative, current, parts[-1]) from None
            raise FileRefused(f"{relative}: {exc.strerror or exc}") from None
        fds.append(fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"{relative} is {kind(info.st_mode)}, not a regular file")
        yield fd, info
    finally:
        for opened in reversed(fds):
            os.close(opened)


def read_blocks(fd: int, limit: int) -> Iterator[bytes]:
    """Blocks of an open file, at most limit + 1 bytes in all (one more than allowed shows growth)."""
    left = limit + 1
    while left > 0:
        block = os.read(fd, min(READ_BLOCK, left))
        if not block:
            return
        left -= len(block)
        yield block


def read_inside(dir_fd: int, relative: str, cap: int, what: str = "file") -> bytes:
    """The whole regular file `relative`, refused (FileRefused) when it holds more than `cap`
    bytes — judged by fstat first and by what the read returns, so growth cannot get past it."""
    with open_inside(dir_fd, relative) as (fd, info):
        if info.st_size > cap:
            raise FileRefused(f"{relative} has {info.st_size} bytes, more than the {cap} a {what} may have")
        data = b"".join(read_blocks(fd, cap))
    if len(data) > cap:
        raise FileRefused(f"{relative} grew past the {cap} bytes a {what} may have while it was read")
    return data


def hash_inside(dir_fd: int, relative: str, expected_bytes: int) -> tuple[int, str | None]:
    """(size, sha256) of the regular file `relative`; the sha256 is None when the size differs
    from `expected_bytes` (a truncated copy is named by its size, without reading it)."""
    with open_inside(dir_fd, relative) as (fd, info):
        if info.st_size != expected_bytes:
            return info.st_size, None
        digest = hashlib.sha256()
        size = 0
        for block in read_blocks(fd, expected_bytes):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest() if size == expected_bytes else None
