"""CI's strict mode: with DECIDE_STRICT=1 (set by .ci/run) a skipped test marked `heavy` (bundle,
matrix, ARM64: the ones that need root, qemu or a build) is reported as a failure, so a CI run
cannot pass while silently not testing the zips. A pytest hook, registered by conftest.py."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """Under DECIDE_STRICT=1, a skip of a `heavy` test (in any phase) becomes a failure."""
    outcome = yield
    report = outcome.get_result()
    if (os.environ.get("DECIDE_STRICT") == "1" and report.skipped
            and item.get_closest_marker("heavy") is not None):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"DECIDE_STRICT=1: a heavy test may not be skipped; it would have skipped: {reason}"
