"""The zips the heavy tests run: the ones built from the tree under test, or a skip saying why
(a failure under DECIDE_STRICT=1, see strict_mode.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bundle_spec import matrix
from runtime.platform.appdir import DEFAULT_MODEL

REPO = Path(__file__).resolve().parent.parent
# Another package directory of the same name can be embedded instead (e.g. while the factory's
# model is not built yet): DECIDE_BUNDLE_MODEL=/path/to/<name>.
MODEL_DIR = Path(os.environ.get("DECIDE_BUNDLE_MODEL", REPO / DEFAULT_MODEL))


def zip_of_this_tree(arch: str) -> Path:
    """The `arch` zip of this commit and inputs (built when missing: needs root), or skip."""
    if not (MODEL_DIR / "manifest.json").is_file():
        pytest.skip(f"{MODEL_DIR} is not built yet (the bundle embeds it)")
    try:
        return matrix.zip_for_tree(arch, MODEL_DIR, REPO / "build" / f"test-build-{arch}.log")
    except matrix.BundleUnavailable as exc:
        pytest.skip(str(exc))
