"""Fixtures for end-to-end tests: one real control plane per session, a fresh namespace and kit per test."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator

import pytest

from localcluster import binaries
from localcluster.cluster import ClusterError, LocalCluster
from tests.conftest import unavailable
from tests.e2e.kit import Kit

_started: dict[str, LocalCluster] = {}


def pytest_report_header() -> str:
    """Which Kubernetes set the suite runs against (RESERVOIR_KUBERNETES, localcluster/binaries.py)."""
    return (f"kubernetes: {binaries.versions()['KUBERNETES_VERSION']} "
            f"({binaries.KUBERNETES_SET}={binaries.kubernetes_set()}), {binaries.bin_dir()}")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    missing = binaries.missing()
    if missing:
        build = "make cluster-bin" if binaries.kubernetes_set() == "latest" else (
            f"{binaries.KUBERNETES_SET}={binaries.kubernetes_set()} localcluster/build.sh")
        message = f"control-plane binaries not built in {binaries.bin_dir()} ({', '.join(missing)}): run `{build}`"
        unavailable(message)
    local = LocalCluster(log=lambda line: print(line, file=sys.stderr))
    try:
        local.start()
    except ClusterError as err:
        pytest.fail(f"local control plane failed to start: {err}")
    _started["cluster"] = local
    yield local
    local.stop()


@pytest.fixture
async def kit(cluster: LocalCluster, request: pytest.FixtureRequest) -> AsyncIterator[Kit]:
    cluster.check_alive()
    k = await Kit.open(cluster, request.node.name)
    try:
        yield k
    finally:
        await k.close()
