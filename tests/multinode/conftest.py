"""Multi-node tests: a namespaced Ray cluster (tests/support/netcluster.py) per module."""

from __future__ import annotations

import pytest
from support.netcluster import netcluster_factory  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def netcluster(netcluster_factory):  # noqa: F811
    """Three nodes (support.netcluster.THREE_NODES) for the tests of one module."""
    c = netcluster_factory()
    yield c
    c.stop()
