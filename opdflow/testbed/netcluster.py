"""A Ray cluster of several nodes on one machine, each node a machine of its own to Ray.

Multi-node behaviour (a learner group across hosts, weights crossing nodes, a node lost
or cut off) tried and tested without a cloud account. Not a fake provider: every node is a
real `ray start` (raynode.py) in its own network namespace with its own address in
198.18.0.0/15 (netns.py) and its own /tmp and /dev/shm. The nodes share one directory,
`shared`, standing in for NFS: run directories, checkpoints, the model cache
(OPDFLOW_CACHE=shared/cache, seeded from this machine's). The head runs the GCS and the
dashboard with Ray's token authentication, the cluster's own token given to every node
and, by `client_env()`, to clients. Nodes run this checkout's opdflow with this
interpreter's Ray.

`stop` kills every process of every node by pid (`ip netns pids`) and deletes the
namespaces, links and bridge; it runs at interpreter exit too, and `cleanup_stale()`
removes what a killed owner left. `cluster/netcluster.py up N` / `down` is this class
from a shell.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from opdflow.testbed.netns import Bridge, Namespace, pick_subnet
from opdflow.testbed.raynode import (
    DASHBOARD_PORT,
    GCS_PORT,
    HealthCheck,
    Node,
    NodeSpec,
    ray_start_argv,
    refuse_hidden,
    start_in_namespace,
)

__all__ = ["SPANNING", "HealthCheck", "NetCluster", "Node", "NodeSpec", "cleanup_stale", "layout"]

STATE_ROOT = Path("/var/tmp")
"""Where instances keep their base directory (state.json, token, logs, shared storage):
outside /tmp, which every node replaces with a private tmpfs."""
SPANNING = (
    "resources.learner.workers=2",
    'resources.learner.resources={"learner": 1}',
    'resources.generator.resources={"rollout": 1}',
)
"""`--set` values that spread a run over `layout()`: a learner rank on each of nodes 1 and
2, the generators on node 3 and after; rescorer, teacher, evaluator (no CPU, no custom
resource) land wherever Ray finds room."""


def layout(n: int = 3, cpus: float = 2.0) -> list[NodeSpec]:
    """N nodes: the head and node 2 advertise {"learner": 1}, nodes 3.. {"rollout": 1}."""
    return [
        NodeSpec("head" if i == 0 else f"node{i + 1}", cpus, {"learner" if i < 2 else "rollout": 1})
        for i in range(n)
    ]


class NetCluster:
    """N Ray nodes on one machine, each in its own network and mount namespace (a context
    manager: leaving it tears everything down)."""

    _instances = 0

    def __init__(
        self,
        base: Path | None = None,
        *,
        health: HealthCheck | None = None,
        python: str | None = None,
        pythonpath: str | None = None,
        env: dict[str, str] | None = None,
        owned: bool = True,
    ):
        """`base`: where state, token, logs and the shared storage live (default
        /var/tmp/opdnet-TAG); `python`: the interpreter whose `ray` the nodes run (default
        this one); `pythonpath`: the opdflow checkout the nodes import (default this one's);
        `env`: more environment for every node; `owned`: torn down when this process exits
        (False for a cluster started from a shell that outlives the command)."""
        NetCluster._instances += 1
        self.tag = f"{os.getpid()}{NetCluster._instances % 10}"
        """Unique per instance on this machine: the pid and one digit."""
        self.base = Path(base or STATE_ROOT / f"opdnet-{self.tag}")
        self.shared = self.base / "shared"
        """Storage every node sees at the same path (the stand-in for NFS)."""
        self.token_path = self.base / "token"
        self.health = health or HealthCheck()
        self.python = python or sys.executable
        self.pythonpath = pythonpath or str(Path(__file__).resolve().parents[2])
        self.extra_env = dict(env or {})
        self.owned = owned
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge: Bridge | None = None
        self.nodes: list[Node] = []
        self._atexit = False

    # ------------------------------------------------------------------ addresses

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def gcs_address(self) -> str:
        return f"{self.head.ip}:{GCS_PORT}"

    @property
    def dashboard(self) -> str:
        """The Jobs API address (`opdflow submit --address`)."""
        return f"http://{self.head.ip}:{DASHBOARD_PORT}"

    def token(self) -> str:
        return self.token_path.read_text().strip()

    def client_env(self) -> dict[str, str]:
        """Environment of a client in the root namespace (`opdflow submit/status/logs`)."""
        return {
            "RAY_ADDRESS": self.dashboard,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token(),
            "NO_PROXY": ",".join(filter(None, [os.environ.get("NO_PROXY"), str(self.subnet)])),
        }

    def node_env(self) -> dict[str, str]:
        """Environment of every process of every node."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        venv_bin = str(Path(self.python).parent)
        env.update(
            PATH=f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}",
            PYTHONPATH=self.pythonpath,
            OPDFLOW_CACHE=str(self.shared / "cache"),
            TMPDIR="/tmp",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN_PATH=str(self.token_path),
            RAY_USAGE_STATS_ENABLED="0",
            # every node's memory monitor sees the whole machine's memory, so each would
            # kill its own workers for what the other nodes use: the kernel's OOM killer only
            RAY_memory_monitor_refresh_ms="0",
            **self.health.env(),
            **self.extra_env,
        )
        return env

    # ------------------------------------------------------------------ lifecycle

    def start(self, specs: list[NodeSpec], timeout_s: float = 180.0) -> NetCluster:
        """The network, the head (specs[0]) and the workers; returns once every node is
        alive in Ray's node table. On any failure everything started is torn down."""
        if self.nodes:
            raise RuntimeError("this NetCluster is already started")
        refuse_hidden(python=self.python, pythonpath=self.pythonpath, base=self.base)
        try:
            self.base.mkdir(parents=True, exist_ok=True)
            (self.base / "logs").mkdir(exist_ok=True)
            self.shared.mkdir(exist_ok=True)
            self.token_path.write_text(secrets.token_hex(32))
            self.token_path.chmod(0o600)
            seed_cache(self.shared / "cache")
            self.subnet = pick_subnet(os.getpid())
            hosts = list(self.subnet.hosts())
            self.bridge = Bridge(f"opdb{self.tag}", ipaddress.ip_interface(f"{hosts[0]}/24"))
            self._save()  # before anything exists: `down` and cleanup_stale find it all
            if self.owned and not self._atexit:
                atexit.register(self.stop)
                self._atexit = True
            self.bridge.create()
            for spec in specs:
                self.add_node(spec, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, spec: NodeSpec, timeout_s: float = 180.0) -> Node:
        """A new node (the head if it is the first): a namespace on the bridge, `ray start`
        in it; returns once Ray lists it alive."""
        if self.subnet is None or self.bridge is None:
            raise RuntimeError("add_node needs a started cluster: call start() first")
        index = len(self.nodes) + 1
        address = ipaddress.ip_interface(f"{list(self.subnet.hosts())[9 + index]}/24")
        ns = Namespace(f"opd-{self.tag}-{index}", f"opdv{self.tag}n{index}", address)
        node = Node(index, spec, ns, head=not self.nodes)
        self.nodes.append(node)
        self._save()
        ns.create(self.bridge)
        self.start_node(node, timeout_s)
        return node

    def start_node(self, node: Node, timeout_s: float = 180.0) -> None:
        """`ray start` in the node's namespace (a fresh Ray node at its address: a node Ray
        declared dead never rejoins); returns once it is alive in Ray's node table."""
        node.starts += 1
        log = self.base / "logs" / f"node{node.index}-{node.starts}.log"
        argv = ray_start_argv(node, self.python, self.gcs_address)
        start_in_namespace(node, argv, self.node_env(), log, timeout_s)
        self.wait_alive(node.ip, timeout_s)

    def kill_node(self, node: Node) -> list[int]:
        """SIGKILL every process of the node (by pid, `ip netns pids`), as a machine that
        loses power; returns once none is left. The node's private tmpfs goes with them."""
        pids = node.ns.kill_all(signal.SIGKILL)
        deadline = time.time() + 30
        while node.ns.pids() and time.time() < deadline:
            time.sleep(0.1)
        return pids

    def restart_node(self, node: Node, timeout_s: float = 180.0) -> None:
        """Whatever is left of the node killed, then a fresh Ray node started at its address
        (as a machine that rebooted, or a replacement with the same address)."""
        self.kill_node(node)
        self.start_node(node, timeout_s)

    def link(self, node: Node, up: bool) -> None:
        """Take the node's only link down (a partition: its processes run on, unreachable)
        or bring it back up."""
        node.ns.link(up)

    def run_in(self, node: Node, argv: list[str], timeout_s: float = 60.0) -> str:
        """Run `argv` on a node: in its network and mount namespaces (as its Ray processes
        see the machine: its private /tmp); its stdout (raises on a non-zero exit)."""
        pids = node.ns.pids()
        if not pids:
            raise RuntimeError(f"node {node.index} ({node.ip}) runs no process")
        cmd = ["nsenter", "-t", str(min(pids)), "-m", "-n", "--", *argv]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env=self.node_env())  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"{argv} on node {node.index}: {proc.stderr.strip()}")
        return proc.stdout

    def restart(self, timeout_s: float = 180.0) -> None:
        """The cluster started again after its head was lost: the head and every worker that
        was still up killed and started again (a worker cannot rejoin a new GCS); nodes
        already down stay down."""
        up = [n for n in self.nodes if n.head or n.ns.pids()]
        for node in reversed(up):
            self.kill_node(node)
        for node in up:
            self.start_node(node, timeout_s)

    def stop(self) -> None:
        """Kill every process of every node by pid, delete the namespaces, links and the
        bridge, and the base directory (shared storage included) of an owned cluster.
        Safe to call more than once."""
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                self.kill_node(node)
            node.ns.delete()
        if self.bridge is not None:
            self.bridge.delete()
        self.nodes, self.bridge = [], None
        if self._atexit:
            atexit.unregister(self.stop)
            self._atexit = False
        if self.base.exists():
            if self.owned:
                shutil.rmtree(self.base, ignore_errors=True)
            else:
                (self.base / "state.json").unlink(missing_ok=True)

    def __enter__(self) -> NetCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ Ray's view

    def get(self, path: str, timeout_s: float = 10.0) -> Any:
        """GET a dashboard endpoint with the cluster's token (no proxy); its JSON."""
        req = urllib.request.Request(
            self.dashboard + path, headers={"Authorization": f"Bearer {self.token()}"}
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=timeout_s) as resp:
            return json.load(resp)

    def ray_nodes(self) -> list[dict[str, Any]]:
        """Ray's node table: [{"node_id", "node_ip", "state", "resources_total"}, ...]."""
        data = self.get("/api/v0/nodes?limit=1000&detail=true")
        return [
            {k: n.get(k) for k in ("node_id", "node_ip", "state", "resources_total")}
            for n in data["data"]["result"]["result"]
        ]

    def wait_alive(self, ip: str, timeout_s: float) -> dict[str, Any]:
        """Ray's entry of the node at `ip`, once it is ALIVE (its latest start)."""
        deadline, last = time.time() + timeout_s, "no answer from the dashboard"
        while time.time() < deadline:
            try:
                alive = [
                    n for n in self.ray_nodes() if n["node_ip"] == ip and n["state"] == "ALIVE"
                ]
                if alive:
                    return alive[0]
                last = f"node {ip} not alive in Ray's node table"
            except (OSError, ValueError, KeyError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)
        raise TimeoutError(f"node {ip} not alive after {timeout_s:.0f} s: {last}")

    def wait_dead(self, ip: str, timeout_s: float) -> None:
        """Until Ray lists no alive node at `ip` (its health check declared it dead)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if not [n for n in self.ray_nodes() if n["node_ip"] == ip and n["state"] == "ALIVE"]:
                return
            time.sleep(0.5)
        raise TimeoutError(f"node {ip} still alive after {timeout_s:.0f} s")

    # ------------------------------------------------------------------ state on disk

    def _save(self) -> None:
        """state.json: what exists, so `down` (another process) and cleanup_stale find it."""
        state = {
            "owner_pid": os.getpid() if self.owned else None,
            "tag": self.tag,
            "subnet": str(self.subnet),
            "bridge": asdict(self.bridge) if self.bridge else None,
            "nodes": [
                {
                    "index": n.index,
                    "spec": asdict(n.spec),
                    "head": n.head,
                    "ns": {"name": n.ns.name, "veth": n.ns.veth, "address": str(n.ns.address)},
                }
                for n in self.nodes
            ],
        }
        (self.base / "state.json").write_text(json.dumps(state, indent=2, default=str))

    @classmethod
    def load(cls, base: Path) -> NetCluster:
        """The cluster a state.json describes (started by another process), to stop it."""
        state = json.loads((Path(base) / "state.json").read_text())
        c = cls(Path(base), owned=state["owner_pid"] is not None)
        c.tag = state["tag"]
        c.subnet = ipaddress.ip_network(state["subnet"]) if state["subnet"] != "None" else None
        if state["bridge"]:
            b = state["bridge"]
            c.bridge = Bridge(b["name"], ipaddress.ip_interface(b["address"]))
        for n in state["nodes"]:
            ns = Namespace(
                n["ns"]["name"], n["ns"]["veth"], ipaddress.ip_interface(n["ns"]["address"])
            )
            c.nodes.append(Node(n["index"], NodeSpec(**n["spec"]), ns, n["head"]))
        return c


def seed_cache(cache: Path) -> None:
    """Copy this machine's built tiny models (OPDFLOW_CACHE, default ~/.cache/opdflow) into
    the shared cache, so the nodes do not build them again (a few MB; complete builds only)."""
    src = Path(os.environ.get("OPDFLOW_CACHE", Path.home() / ".cache" / "opdflow"))
    cache.mkdir(parents=True, exist_ok=True)
    if not src.is_dir():
        return
    for build in src.iterdir():
        if (build / "build.json").is_file() and not (cache / build.name).exists():
            shutil.copytree(build, cache / build.name)


def cleanup_stale(root: Path = STATE_ROOT) -> list[Path]:
    """Tear down clusters whose owning process is gone (a test run that was killed); the
    base directories removed. Clusters started from a shell (no owner) are left alone."""
    removed = []
    for state in sorted(root.glob("opdnet-*/state.json")):
        try:
            owner = json.loads(state.read_text())["owner_pid"]
        except (OSError, ValueError, KeyError):
            continue
        if owner is None or _alive(owner):
            continue
        NetCluster.load(state.parent).stop()
        removed.append(state.parent)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
