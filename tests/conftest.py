"""Shared fixtures for the runtime tests: the tiny package, the real default model (if present).

Registers CI's strict mode (tests/strict_mode.py): under DECIDE_STRICT=1 a skipped `heavy` test
(bundle, matrix, ARM64) is a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures import tiny_package  # tests/ is on sys.path: pytest's rootdir-relative import
from strict_mode import pytest_runtest_makereport  # noqa: F401  (the hook, registered here)

from runtime.platform.appdir import DEFAULT_MODEL

REPO = Path(__file__).resolve().parent.parent
REAL_MODEL = REPO / DEFAULT_MODEL


@pytest.fixture(scope="session")
def tiny_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly built tiny model package (read-only by convention: copy it to tamper)."""
    return tiny_package.build(tmp_path_factory.mktemp("tiny") / "tiny-keywords")


@pytest.fixture(scope="session")
def tiny_scoped_package_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny package with abstention: a negative label and a novelty output (read-only)."""
    return tiny_package.build(tmp_path_factory.mktemp("tiny-scoped") / "tiny-scoped", scoped=True)


@pytest.fixture(scope="session")
def host_tier():
    """The tier decide picks on this machine: expectations that depend on the CPU's kernels (an
    int8 variant's own outputs) are keyed by the variants this tier serves."""
    from runtime.platform.appdir import find_data_dir
    from runtime.platform.cpu import probe
    from runtime.platform.tiers import load_platform, select

    features = probe()
    return select(features, load_platform(find_data_dir("platforms"), features.arch), None).tier


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """The default model package; tests using it skip with a reason when it is not built yet."""
    if not (REAL_MODEL / "manifest.json").is_file():
        pytest.skip(f"real model not present at {REAL_MODEL} (built by models/; run the factory first)")
    return REAL_MODEL
