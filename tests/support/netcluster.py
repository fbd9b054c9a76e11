"""A namespaced multi-node Ray cluster for a test (opdflow.testbed.netcluster), torn down
whatever happens: a finalizer, Ctrl-C and SIGTERM (turned into KeyboardInterrupt while it
runs), and interpreter exit. Where namespaces are not permitted the test is skipped with
the reason.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable, Iterator

import pytest

from opdflow.testbed.netcluster import HealthCheck, NetCluster, NodeSpec, cleanup_stale

THREE_NODES = [
    NodeSpec("head", 2, {"learner": 1}),
    NodeSpec("learner-b", 2, {"learner": 1}),
    NodeSpec("rollout", 2, {"rollout": 1}),
]
"""The default layout: learner ranks on nodes 1 and 2 (one each), generators on node 3;
rescorer, teacher, evaluator (no CPU, no custom resource) and the job's driver on the head."""

ACROSS_NODES = [
    "resources.learner.workers=2",
    'resources.learner.resources={"learner": 1}',
    'resources.generator.resources={"rollout": 1}',
]
"""--set lines that place a run on THREE_NODES: 2 learner ranks on nodes 1 and 2,
generators on node 3."""


@functools.cache
def why_not() -> str | None:
    """Why a namespaced cluster cannot run here (None when it can)."""
    from opdflow.testbed.netns import unavailable

    return unavailable()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def netcluster_factory() -> Iterator[Callable[..., NetCluster]]:
    """make(specs=THREE_NODES, health=None) -> a started NetCluster; every cluster made is
    torn down at the end of the session at the latest (a test may stop one earlier)."""
    if (why := why_not()) is not None:
        pytest.skip(f"no namespaced cluster: {why}")
    cleanup_stale()  # what a killed earlier run of this machine left
    made: list[NetCluster] = []
    old = signal.signal(signal.SIGTERM, _raise_interrupt)

    def make(specs: list[NodeSpec] | None = None, health: HealthCheck | None = None) -> NetCluster:
        c = NetCluster(health=health)
        made.append(c)
        return c.start(list(specs or THREE_NODES))

    try:
        yield make
    finally:
        for c in reversed(made):
            c.stop()
        signal.signal(signal.SIGTERM, old)
