"""`serve --watch DIR`: notice a new complete package in DIR and hand it to the swapper.

DIR holds one package per subdirectory (e.g. /var/lib/decide/incoming/alarms-2.1.0/). What is in
DIR when decide starts is taken as known, not loaded. A subdirectory is a candidate when it is new
or changed since decide last tried it, and it is tried once it is *complete*:

- settled: its listing (names, sizes, modification times) did not change between two looks, and
- whole: manifest.json reads, the directory holds nothing else than the files it lists (and the
  signature), and every listed file is there with its listed size.

Only then is it handed to the swapper, whose build hashes every file, checks the signature, warms
and self-tests it. A half-copied package (files missing or short) is never tried: it waits,
with one log line, until its listing changes. A package that was tried — served or refused — is
not tried again until its listing changes, so a broken package is not retried in a loop. Of
several candidates the one whose manifest.json changed last wins. Stdlib only, stat calls only
(no hashing, no inotify): a look costs one stat per file.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from runtime.package.manifest import MANIFEST_NAME, PackageError

log = logging.getLogger("decide")

MAX_ENTRIES = 10_000  # per package directory, as runtime/package/load.py allows
MAX_DEPTH = 16
DEFAULT_INTERVAL_S = 2.0

Fingerprint = tuple[tuple[str, int, int, int], ...]  # (relative path, size, mtime_ns, mode) per entry


def fingerprint(directory: Path) -> Fingerprint | None:
    """The listing of a package directory (not following symlinks); None when unreadable."""
    entries: list[tuple[str, int, int, int]] = []
    pending = [(directory, "", 0)]
    try:
        while pending:
            path, prefix, depth = pending.pop()
            with os.scandir(path) as listing:
                for entry in listing:
                    info = entry.stat(follow_symlinks=False)
                    entries.append((prefix + entry.name, info.st_size, info.st_mtime_ns, info.st_mode))
                    if len(entries) > MAX_ENTRIES:
                        return None
                    if stat.S_ISDIR(info.st_mode) and depth + 1 < MAX_DEPTH:
                        pending.append((Path(entry.path), prefix + entry.name + "/", depth + 1))
    except OSError:
        return None
    return tuple(sorted(entries))


def incomplete(directory: Path) -> str | None:
    """Why the package in `directory` is not complete yet (None: it is): see the module docstring."""
    from runtime.package.load import load_package  # stdlib only, but keeps this module light

    try:
        package = load_package(directory)
    except PackageError as exc:
        return str(exc)
    for entry in package.manifest.files():
        try:
            size = os.stat(package.path(entry), follow_symlinks=False).st_size
        except OSError as exc:
            return f"{entry.file}: {exc.strerror or exc}"
        if size != entry.bytes:
            return f"{entry.file} has {size} of {entry.bytes} bytes"
    return None


def watcher_for(directory: Path | None, interval_s: float) -> PackageWatcher | None:
    """The watcher of `serve --watch DIR` (None without it); ValueError for a bad DIR or interval."""
    if directory is None:
        return None
    if not 0.1 <= interval_s <= 3600:
        raise ValueError("--watch-interval must be between 0.1 and 3600 seconds")
    if not directory.is_dir():
        raise ValueError(f"--watch {directory}: not a directory")
    return PackageWatcher(directory, interval_s)


class PackageWatcher:
    """Looks at DIR's subdirectories; `poll()` returns the one to load now, if any."""

    def __init__(self, directory: Path, interval_s: float = DEFAULT_INTERVAL_S):
        self.directory = directory
        self.interval_s = interval_s
        self.tried: dict[str, Fingerprint | None] = {}  # name → listing when last tried (or at start)
        self.previous_look: dict[str, Fingerprint | None] = {}
        self.waiting_logged: dict[str, Fingerprint | None] = {}
        for name, listing in self._look().items():
            self.tried[name] = listing
        self.previous_look = dict(self.tried)

    def _look(self) -> dict[str, Fingerprint | None]:
        try:
            names = sorted(entry.name for entry in os.scandir(self.directory)
                           if entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."))
        except OSError as exc:
            log.warning("--watch %s: cannot list it (%s)", self.directory, exc.strerror or exc)
            return {}
        return {name: fingerprint(self.directory / name) for name in names}

    def poll(self) -> Path | None:
        """One look: the newest new-or-changed, settled and complete package directory (marked as
        tried), or None."""
        look = self._look()
        settled = [name for name, listing in look.items()
                   if listing is not None and listing != self.tried.get(name)
                   and listing == self.previous_look.get(name)]
        self.previous_look = look
        ready: list[tuple[int, str]] = []
        for name in settled:
            if self.waiting_logged.get(name) == look[name]:
                continue  # found incomplete with this very listing already
            reason = incomplete(self.directory / name)
            if reason is None:
                ready.append((_manifest_mtime(look[name]), name))
            elif self.waiting_logged.get(name) != look[name]:
                self.waiting_logged[name] = look[name]
                log.info("--watch: %s is not complete yet, waiting for it to change: %s",
                         self.directory / name, reason)
        if not ready:
            return None
        _, name = max(ready)
        self.tried[name] = look[name]
        return self.directory / name


    def forget(self, path: Path) -> None:
        """`path` was handed out but could not be tried: hand it out again at the next look."""
        self.tried.pop(path.name, None)


def _manifest_mtime(listing: Fingerprint | None) -> int:
    return next((mtime for name, _, mtime, _ in listing or () if name == MANIFEST_NAME), 0)
