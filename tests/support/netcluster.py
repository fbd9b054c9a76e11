"""A namespaced multi-node Ray cluster for a test (opdflow.testbed.netcluster), torn down
whatever happens: a finalizer, Ctrl-C and SIGTERM (turned into KeyboardInterrupt while it
runs), and interpreter exit. Where namespaces are not permitted the test is skipped with
the reason.
"""

from __future__ import annotations

import functools
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from opdflow.testbed.netcluster import (
    SPANNING,
    HealthCheck,
    NetCluster,
    NodeSpec,
    cleanup_stale,
    layout,
)

__all__ = ["HealthCheck", "NetCluster", "NodeSpec"]  # re-exported for the tests

THREE_NODES = layout(3)
"""The default layout: learner ranks on nodes 1 and 2 (one each), generators on node 3;
rescorer, teacher, evaluator (no CPU, no custom resource) wherever Ray finds room; the
job's driver on the head."""

ACROSS_NODES = [x for kv in SPANNING for x in ("--set", kv)]
"""Arguments that place a run on THREE_NODES: 2 learner ranks on nodes 1 and 2 (one each),
generators on node 3."""

ROOT = Path(__file__).resolve().parents[2]
"""The checkout the nodes run."""
DEMO_SYNC = f"{ROOT}/pipelines/tiny_cpu.py:synchronous"
"""The demo at k = 0: every step's batch from the newest weights, so a run's metrics are a
function of the config and seed alone, wherever its actors run."""
DEMO_SIZE = [
    "--steps", "8", "--set", "eval.every=4", "--set", "eval.prompts=16",
    "--set", "reliability.checkpoint_every=4", "--set", "resources.learner.workers=2",
]  # fmt: skip
"""8 steps, 2 learner ranks, a checkpoint at step 4: the size every multi-node demo run
compared with the single-node one has."""
EXACT = ("step", "version", "staleness", "tokens", "responses")
CLOSE = ("loss", "d_engine_k1", "d_engine_k3", "d_stale_k1", "d_total_k1", "train_kl",
         "entropy", "grad_norm", "heldout_kl", "heldout_accuracy")  # fmt: skip


@functools.cache
def why_not() -> str | None:
    """Why a namespaced cluster cannot run here (None when it can): no namespaces, or this
    venv or checkout where the nodes cannot see it (under /tmp, which each node has empty)."""
    from opdflow.testbed.netns import unavailable
    from opdflow.testbed.raynode import hidden_from_nodes

    if hidden := hidden_from_nodes([sys.executable, ROOT]):
        return f"the nodes cannot see {', '.join(hidden)} (each has its own /tmp)"
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


def opdflow_cli(cluster: NetCluster, args: list[str]):
    """`opdflow ARGS` from the root namespace against `cluster` (its address and token);
    the click Result."""
    from click.testing import CliRunner

    from opdflow.cli import main
    from opdflow.cluster.connection import sync_auth

    try:
        return CliRunner().invoke(main, args, env=cluster.client_env(), catch_exceptions=False)
    finally:
        sync_auth()  # Ray's auth state back to this process's environment


def submit(cluster: NetCluster, spec: str, args: list[str], wait: bool = True) -> tuple[Any, str]:
    """`opdflow submit SPEC ARGS --wait/--no-wait` to `cluster`: (Result, job id)."""
    res = opdflow_cli(cluster, ["submit", spec, *args, "--wait" if wait else "--no-wait"])
    ids = [line for line in res.output.splitlines() if line.startswith("opdflow-")]
    return res, ids[0] if ids else ""


def job_status(cluster: NetCluster, job_id: str, timeout_s: float = 900.0) -> str:
    """The job's status once it is terminal (SUCCEEDED, FAILED, STOPPED)."""
    import os

    from opdflow.cluster.connection import sync_auth
    from opdflow.commands.jobs import job_client

    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ.update({k: cluster.client_env()[k] for k in saved})
    try:
        client = job_client(cluster.dashboard)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            status = client.get_job_status(job_id)
            if status.is_terminal():
                return str(status)
            time.sleep(2)
        raise TimeoutError(f"job {job_id} not finished after {timeout_s:.0f} s")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sync_auth()


def wait_for_step(run_dir: Path, step: int, timeout_s: float = 600.0) -> int:
    """Until the run in `run_dir` (on the shared storage) has trained `step`; the steps
    trained by then."""
    from opdflow.record.rundir import read_table

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        path = run_dir / "metrics.parquet"
        if path.is_file():
            try:
                done = len(read_table(path))
            except (OSError, ValueError):  # being replaced
                done = 0
            if done > step:
                return done
        time.sleep(0.5)
    raise TimeoutError(f"{run_dir}: step {step} not trained after {timeout_s:.0f} s")


def alive_with(cluster: NetCluster, resource: str) -> Any:
    """The last node started that advertises `resource` and runs processes."""
    nodes = [n for n in cluster.nodes if resource in n.spec.resources and n.ns.pids()]
    if not nodes:
        raise LookupError(f"no running node advertises {resource!r}")
    return nodes[-1]


def assert_same_metrics(rows: list[dict], reference: list[dict]) -> None:
    """Row by row: counts equal, float metrics within float tolerance (NaN where NaN)."""
    assert [r["step"] for r in rows] == [r["step"] for r in reference]
    for got, want in zip(rows, reference):
        for key in EXACT:
            assert got[key] == want[key], (key, got["step"])
        for key in CLOSE:
            a, b = got[key], want[key]
            if isinstance(b, float) and math.isnan(b):
                assert math.isnan(a), (key, got["step"], a)
            else:
                assert a == pytest.approx(b, rel=1e-5, abs=1e-7), (key, got["step"])
