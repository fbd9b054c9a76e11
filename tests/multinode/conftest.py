"""Multi-node tests: a namespaced Ray cluster (tests/support/netcluster.py) per module,
and the single-node run of the demo that runs across nodes must equal."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.netcluster import DEMO_SIZE, DEMO_SYNC, ROOT, netcluster_factory, why_not  # noqa: F401


@pytest.fixture(scope="module")
def netcluster(netcluster_factory):  # noqa: F811
    """Three nodes (support.netcluster.THREE_NODES) for the tests of one module."""
    c = netcluster_factory()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def shared_netcluster(netcluster_factory):  # noqa: F811
    """Three nodes shared by the modules whose tests leave the cluster as they found it
    (they override `netcluster` with it); stopped at the end of the session."""
    return netcluster_factory()


@pytest.fixture(scope="session")
def single_node_demo(tmp_path_factory, tiny) -> list[dict]:
    """Metrics rows of the demo at DEMO_SIZE on one node: `opdflow run` on its embedded
    loopback cluster, both learner ranks there."""
    if (why := why_not()) is not None:
        pytest.skip(f"no namespaced cluster: {why}")
    from opdflow.record.rundir import read_table

    out = tmp_path_factory.mktemp("single") / "run"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "opdflow.cli", "run", DEMO_SYNC, *DEMO_SIZE, "--run-dir", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_table(out / "metrics.parquet")
