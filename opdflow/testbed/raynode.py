"""One Ray node of the namespaced cluster (netcluster.py): what it is and how it starts.

A node is a NodeSpec (name, CPUs, custom resources, object store size) placed in a network
namespace (netns.py); `ray start` runs there in a mount namespace of its own, where /tmp
(Ray's temp and spill directories) and /dev/shm (the object store) are private tmpfs. The
head adds the GCS and the dashboard; a worker joins the head's GCS. Ray's health check is
shortened (HealthCheck) so a silent node is declared dead in seconds.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from opdflow.testbed.netns import Namespace

GCS_PORT, DASHBOARD_PORT = 6379, 8265
"""Ray's default ports: each node has its own network namespace, so no two clash."""
PRIVATE_DIRS = ("/tmp",)
"""Paths each node gets as a private tmpfs (Ray's temp dir /tmp/ray lives there)."""


def hidden_from_nodes(paths: list[str | Path]) -> list[str]:
    """Those of `paths` no node can see: they lie under a directory each node mounts as its
    own empty tmpfs (PRIVATE_DIRS), as a venv or checkout under /tmp would."""
    return [
        str(p) for p in paths if any(Path(p).absolute().is_relative_to(d) for d in PRIVATE_DIRS)
    ]


def refuse_hidden(**paths: str | Path) -> None:
    """Raise, naming each of `paths` (keyword: its role) that no node can see, before a
    cluster is made: its nodes would fail one by one ("ray: not found")."""
    if hidden := [f"{p} ({role})" for role, p in paths.items() if hidden_from_nodes([p])]:
        raise ValueError(
            f"the nodes cannot see {', '.join(hidden)}: each node mounts its own empty "
            f"{', '.join(PRIVATE_DIRS)}; put them outside it, e.g. under /var/tmp"
        )


@dataclass(frozen=True)
class NodeSpec:
    """One node: its name, logical CPUs, custom resources and object store size."""

    name: str
    num_cpus: float = 2.0
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources, e.g. {"learner": 1}: a stage asking for one lands here."""
    object_store_mb: int = 512
    """Object store size (its /dev/shm tmpfs is given room for it)."""


@dataclass(frozen=True)
class HealthCheck:
    """Ray's node health check (GCS -> raylet), shortened: a node that stops answering is
    dead after about `window_s` (Ray's defaults take 15-30 s)."""

    period_ms: int = 1000
    timeout_ms: int = 2000
    failure_threshold: int = 5

    def env(self) -> dict[str, str]:
        return {
            "RAY_health_check_initial_delay_ms": "0",
            "RAY_health_check_period_ms": str(self.period_ms),
            "RAY_health_check_timeout_ms": str(self.timeout_ms),
            "RAY_health_check_failure_threshold": str(self.failure_threshold),
        }

    @property
    def window_s(self) -> float:
        """Seconds of silence after which Ray declares a node dead, at most."""
        return (self.failure_threshold * self.period_ms + self.timeout_ms) / 1000


@dataclass
class Node:
    """A node of the cluster: its namespace and spec; `starts` counts its `ray start`s."""

    index: int
    spec: NodeSpec
    ns: Namespace
    head: bool = False
    starts: int = 0

    @property
    def ip(self) -> str:
        return str(self.ns.address.ip)


def ray_start_argv(node: Node, python: str, gcs_address: str) -> list[str]:
    """The `ray start` command line of `node` (the `ray` beside `python`): the head with the
    GCS and the dashboard on Ray's default ports, a worker joining `gcs_address`."""
    s = node.spec
    cmd = [
        str(Path(python).parent / "ray"), "start",
        f"--node-ip-address={node.ip}", f"--num-cpus={s.num_cpus:g}",
        f"--resources={json.dumps(s.resources)}",
        f"--object-store-memory={s.object_store_mb * 2**20}",
        "--temp-dir=/tmp/ray", "--disable-usage-stats",
    ]  # fmt: skip
    if node.head:
        return [
            *cmd, "--head", f"--port={GCS_PORT}", "--include-dashboard=true",
            "--dashboard-host=0.0.0.0", f"--dashboard-port={DASHBOARD_PORT}",
        ]  # fmt: skip
    return [*cmd, f"--address={gcs_address}"]


def start_in_namespace(
    node: Node, argv: list[str], env: dict[str, str], log: Path, timeout_s: float
) -> None:
    """Run `argv` (`ray start`, which returns once its processes run) in the node's network
    namespace and a private mount namespace; its output goes to `log`."""
    shm_mb = node.spec.object_store_mb + 256
    with open(log, "w") as out:
        proc = subprocess.run(
            node.ns.argv(argv, PRIVATE_DIRS, shm_mb),
            env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
        )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(
            f"ray start failed on node {node.index} ({node.ip}), exit {proc.returncode}:\n"
            + tail(log)
        )


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
