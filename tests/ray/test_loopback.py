"""The embedded cluster is loopback only: node address and every bound socket on 127.0.0.1.

`opdflow.cluster.connection.connect()` runs in a child Python (its own process group, its own Ray
cluster, stopped by this test through that group, never `ray stop`), which reports the
node address Ray registered and the sockets its process tree (driver, GCS, raylet,
agents, workers) listens on and is connected to. Without cluster.connection.LOOPBACK_ENV, Ray
2.60 registers the node at the interface address and binds GCS, raylet and workers to
all interfaces. The test only reads socket tables; it connects to nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from support.processes import run_python_group
from support.sockets import is_loopback

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json, os, sys
sys.path.insert(0, {tests!r})
import ray
from opdflow.cluster.connection import connect
from support.sockets import sockets

assert connect(1), "expected to start a local cluster"
nodes = [n["NodeManagerAddress"] for n in ray.nodes()]
ctx = ray.get_runtime_context()
ray.get(ray.remote(lambda: 1).remote())  # a worker process is up and serving too
listening, connected = sockets(os.getpid())
print(json.dumps({{"nodes": nodes, "gcs": ctx.gcs_address, "listening": listening,
                  "connected": connected}}))
ray.shutdown()
"""


def test_embedded_cluster_registers_and_binds_loopback_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # the default a user has
    env["PYTHONPATH"] = str(ROOT)
    code, out, err = run_python_group(CHILD.format(tests=str(ROOT / "tests")), env, 180)
    assert code == 0, err[-3000:]
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["nodes"] == ["127.0.0.1"], seen["nodes"]
    assert seen["gcs"].startswith("127.0.0.1:"), seen["gcs"]
    names = {name for name, _, _ in seen["listening"]}
    assert {"gcs_server", "raylet"} <= names, seen["listening"]  # the servers were found
    exposed = [s for s in seen["listening"] if not is_loopback(s[1])]
    assert not exposed, f"listening outside loopback: {exposed}"
    remote = [s for s in seen["connected"] if not is_loopback(s[1])]
    assert not remote, f"connected outside loopback: {remote}"
