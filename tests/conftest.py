"""Shared fixtures for the runtime tests: the tiny package, the real default model (if present)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures import tiny_package  # noqa: E402  (needs the path above)

REAL_MODEL = REPO / "models" / "topics-multilingual"


@pytest.fixture(scope="session")
def tiny_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly built tiny model package (read-only by convention: copy it to tamper)."""
    return tiny_package.build(tmp_path_factory.mktemp("tiny") / "tiny-keywords")


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """The default model package; tests using it skip with a reason when it is not built yet."""
    if not (REAL_MODEL / "manifest.json").is_file():
        pytest.skip(f"real model not present at {REAL_MODEL} (built by models/; run the factory first)")
    return REAL_MODEL
