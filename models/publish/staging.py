"""Where a package is written: the `--out` checks made before any work, the staging directory, the swap.

A package is written into a hidden staging directory next to `--out` (same file system, so the
final rename is atomic) and renamed into place at the end; on any failure or signal the staging
directory is removed and `--out` is left as it was. Torch-free: the command line runs
`check_out_dir` before training starts.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

MANIFEST_NAME = "manifest.json"  # runtime.package.load.MANIFEST_NAME (not imported: this module stays stdlib)
SPACE_MARGIN = 2.0  # the staging copy, the quantizer's scratch files and the old package side by side
# errors of the file system the user can fix (exit 2, one line), as opposed to a bug
USER_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
               errno.EPERM: "operation not permitted"}


class OutDirError(Exception):
    """`--out` cannot take the package (the message says why and what to do)."""


def _existing_parent(path: Path) -> Path:
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")


def check_out_dir(out: Path, estimated_bytes: int) -> None:
    """--out may be new, an empty directory, or an existing package (replaced at the end); its
    folder must be writable and hold about `estimated_bytes` × SPACE_MARGIN free."""
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise OutDirError(f"--out {out}: exists and is not a directory")
        if not ((out / MANIFEST_NAME).is_file() or not any(out.iterdir())):
            raise OutDirError(f"--out {out}: exists and is not a model package (no {MANIFEST_NAME}); "
                              "choose a new directory")
    parent = out.absolute().parent
    folder = parent if parent.is_dir() else _existing_parent(out)
    if parent.exists() and not parent.is_dir():
        raise OutDirError(f"--out {out}: {parent} is not a directory")
    try:  # the staging directory is made here at the end: prove that it can be
        probe = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".probe", dir=folder))
        probe.rmdir()
    except OSError as exc:
        raise OutDirError(f"--out {out}: cannot write in {folder} ({exc.strerror or exc})") from None
    free = shutil.disk_usage(folder).free
    needed = int(estimated_bytes * SPACE_MARGIN)
    if free < needed:
        raise OutDirError(f"--out {out}: {free / 1e6:.0f} MB free in {folder}, the package needs about "
                          f"{needed / 1e6:.0f} MB while it is written; free some space or choose another place")


def staging_dir(out_dir: Path) -> Path:
    """A fresh temporary directory next to `out_dir` (same file system, so the final rename is atomic)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    path.chmod(0o755)  # mkdtemp makes it private; the package is an ordinary directory
    return path


def swap_into(staging: Path, out_dir: Path) -> None:
    """Make `staging` the package at `out_dir`: a rename when out_dir is new or empty, else replace
    the old package (moved aside, removed only after the rename)."""
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    if not out_dir.exists():
        os.rename(staging, out_dir)
        return
    if not (out_dir / MANIFEST_NAME).is_file():
        raise OutDirError(f"{out_dir} exists and is not a model package")
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    os.rename(out_dir, old)
    try:
        os.rename(staging, out_dir)
    except BaseException:
        os.rename(old, out_dir)  # readers keep the old package
        raise
    shutil.rmtree(old, ignore_errors=True)


def user_os_error(exc: OSError) -> str | None:
    """One line for a file-system error the user can fix (full disk, read-only, permissions), else None."""
    what = USER_ERRNOS.get(exc.errno or 0)
    if what is None:
        return None
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{what}{where}: nothing was written"
