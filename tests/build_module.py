"""build.py, loaded for the tests that check its pieces (it is a script, not a package module)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load_build_module() -> ModuleType:
    """Load build.py by path once; registered in sys.modules so its dataclasses resolve."""
    if "decide_build" in sys.modules:
        return sys.modules["decide_build"]
    spec = importlib.util.spec_from_file_location("decide_build", REPO / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["decide_build"] = module
    spec.loader.exec_module(module)
    return module
