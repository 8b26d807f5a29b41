"""Where the factory keeps what it does not commit (fine-tuned checkpoints, downloaded wheels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$DECIDE_FACTORY_CACHE or ~/.cache/decide/factory (created on demand)."""
    path = Path(os.environ.get("DECIDE_FACTORY_CACHE", Path.home() / ".cache" / "decide" / "factory"))
    path.mkdir(parents=True, exist_ok=True)
    return path
