"""Suite-wide rules: with RESERVOIR_REQUIRE_CLUSTER=1 (CI) an end-to-end test may not skip."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

REQUIRE_CLUSTER = os.environ.get("RESERVOIR_REQUIRE_CLUSTER") == "1"


def unavailable(message: str) -> NoReturn:
    """A test's real part (a binary, the control plane, fixtures) is missing: a failure where the cluster is required
    (CI), else a skip naming what to do."""
    if REQUIRE_CLUSTER:
        pytest.fail(message)
    pytest.skip(message)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_CLUSTER and report.skipped and item.get_closest_marker("e2e"):
        report.outcome = "failed"
        report.longrepr = f"end-to-end test skipped while RESERVOIR_REQUIRE_CLUSTER=1: {report.longrepr}"
