"""Where the program's data lives: next to the frozen binary, or the repository root from source."""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_MODEL_NAME = "machine-alarms"
# In the repository the shipped packages live in models/packages/ (models/ is the factory); the
# bundle puts the embedded package straight into models/ next to the binary.
DEFAULT_MODEL = Path("models") / "packages" / DEFAULT_MODEL_NAME
BUNDLED_MODEL = Path("models") / DEFAULT_MODEL_NAME


def app_dir() -> Path:
    """The directory holding models/ and platforms/.

    Frozen (PyInstaller onedir): the executable's directory (the bundle puts models/ and
    platforms/ next to the binary). From source: the repository root (parent of runtime/).
    """
    if getattr(sys, "frozen", False):
        return Path(sys.executable).resolve().parent
    return Path(__file__).resolve().parents[2]  # runtime/platform/appdir.py → the repository


def search_dirs() -> list[Path]:
    """App dir first, then PyInstaller's unpack dir (sys._MEIPASS) if data was bundled there."""
    dirs = [app_dir()]
    meipass = getattr(sys, "_MEIPASS", None)
    if meipass and Path(meipass) not in dirs:
        dirs.append(Path(meipass))
    return dirs


def find_data_dir(relative: Path | str) -> Path:
    """First existing `dir/relative` among search_dirs(); the app-dir path if none exists."""
    for base in search_dirs():
        candidate = base / relative
        if candidate.exists():
            return candidate
    return app_dir() / relative


def default_model_dir() -> Path:
    """The embedded model: models/packages/machine-alarms from source, models/machine-alarms in
    the bundle, or — in a bundle built with another `--model` — the one package (a directory
    with a manifest.json) under models/."""
    for base in search_dirs():
        for relative in (DEFAULT_MODEL, BUNDLED_MODEL):
            if (base / relative).exists():
                return base / relative
    for base in search_dirs():
        packages = sorted(p.parent for p in (base / "models").glob("*/manifest.json"))
        if len(packages) == 1:
            return packages[0]
    return find_data_dir(BUNDLED_MODEL if getattr(sys, "frozen", False) else DEFAULT_MODEL)
