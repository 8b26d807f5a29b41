"""Where the factory keeps what it does not commit (checkpoints, teacher features, wheels)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """$DECIDE_FACTORY_CACHE or ~/.cache/decide/factory (created on demand)."""
    path = Path(os.environ.get("DECIDE_FACTORY_CACHE", Path.home() / ".cache" / "decide" / "factory"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into a temporary file beside `path`, then rename it to `path`.

    A reader sees the old file or the new one; an interrupted or failed write leaves no
    half-written file behind (the temporary one is removed on any exception, Ctrl-C included).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(handle)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
