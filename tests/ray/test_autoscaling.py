"""Rollout nodes follow the generator pool: Ray's fake autoscaling provider, one run.

A head started with `ray start --head --block --autoscaling-config` (the fake_multinode
provider, as ray.cluster_utils.AutoscalingCluster uses it, given a full inline config)
plus a `rollout` node type (min 1, max 2) whose nodes the autoscaler adds for pending
generator replicas and removes when idle. Unlike AutoscalingCluster, which runs
`ray stop --force` (every Ray process on the machine), the cluster runs in its own
process group on private ports and is stopped by killing that group; the run itself is a
subprocess, so this test session's own Ray is untouched. The provider starts its nodes
against get_node_ip_address():6379 unless the config names the GCS address: on private
ports it must (`provider.gcs_address`), or no node ever joins.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

FAKE_CONFIG = {
    "cluster_name": "opdflow-fake",
    "max_workers": 2,
    "provider": {
        "type": "fake_multinode",
        "use_node_id_as_ip": True,
        "disable_node_updaters": True,
        "disable_launch_config_check": True,
    },
    "available_node_types": {
        "ray.head.default": {"resources": {"CPU": 2}, "node_config": {}, "max_workers": 0},
        "rollout": {
            "resources": {"CPU": 1, "rollout": 1},
            "node_config": {},
            "min_workers": 1,
            "max_workers": 2,
        },
    },
    "head_node_type": "ray.head.default",
    "auth": {},
    "upscaling_speed": 1.0,
    "idle_timeout_minutes": 0.1,
    "docker": {},
    "initialization_commands": [],
    "setup_commands": [],
    "head_setup_commands": [],
    "worker_setup_commands": [],
    "head_start_ray_commands": [],
    "worker_start_ray_commands": [],
    "file_mounts": {},
    "cluster_synced_files": [],
    "file_mounts_sync_continuously": False,
    "rsync_exclude": [],
    "rsync_filter": [],
}


DRIVER = r"""
import json, sys, time
import ray
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.rundir import RunDir, read_table

def rollout_nodes():
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("rollout", 0) > 0)

address, run_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
ray.init(address=address, configure_logging=False)
deadline = time.time() + 120
while rollout_nodes() < 1:  # min_workers: one rollout node before the run
    if time.time() > deadline:  # liveness guard, not a speed check
        raise TimeoutError(f"no rollout node joined; nodes: {ray.nodes()}")
    time.sleep(1)
cfg = apply_overrides(PipelineConfig(name="autoscale"), [
    f"train.steps={steps}", f"eval.every={steps}", "eval.prompts=8",
    # the trainer waits for every batch by construction (k = 0), on any CPU, so the adaptive
    # policy pinned at k_max = 0 asks for generation: with a fixed k = 2 the pool grew only
    # where generating was slower than training (not on an AMX CPU, where the learner is)
    "staleness.policy=adaptive", "staleness.k=0", "staleness.k_max=0",
    "engine.replicas=1", "engine.min_replicas=1", "engine.max_replicas=2",
    "engine.scale_down_idle_s=2", "resources.generator.num_cpus=0",
    'resources.generator.resources={"rollout": 1}'])
nodes = []
summary = run_pipeline(cfg, RunDir.create(cfg, run_dir), on_step=lambda row: nodes.append(rollout_nodes()))
after = []
deadline = time.time() + 120
while rollout_nodes() > 1 and time.time() < deadline:  # the idle node leaves
    time.sleep(2)
after.append(rollout_nodes())
print("RESULT " + json.dumps({"nodes": nodes, "after": after, "record": summary["trained_steps_record"]}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:  # loopback only: never a connection to another address
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_rollout_nodes_scale_up_and_down_within_one_run(tiny, tmp_path):
    from opdflow.record.rundir import read_table

    port = _free_port()
    config = tmp_path / "autoscale.json"
    # the provider starts nodes against get_node_ip_address():6379 unless told the GCS address
    fake = {
        **FAKE_CONFIG,
        "provider": {**FAKE_CONFIG["provider"], "gcs_address": f"127.0.0.1:{port}"},
    }
    config.write_text(json.dumps(fake))
    env = {
        **os.environ,
        "AUTOSCALER_UPDATE_INTERVAL_S": "1",
        "RAY_FAKE_CLUSTER": "1",
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("RAY_ADDRESS", None)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    ports = [str(_free_port()) for _ in range(4)]
    ray_tmp = tempfile.mkdtemp(prefix="oas", dir="/tmp")  # AF_UNIX socket paths <= 107 bytes
    log = open(tmp_path / "head.log", "w")  # noqa: SIM115 (closed with the head)
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", f"--autoscaling-config={config}", "--num-cpus=2",
         "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=false",
         f"--temp-dir={ray_tmp}", f"--ray-client-server-port={ports[0]}",
         f"--node-manager-port={ports[1]}", f"--object-manager-port={ports[2]}",
         f"--dashboard-agent-listen-port={ports[3]}"],
        env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def head_up() -> bool:  # the head's GCS is up before the driver connects
            assert head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
            return _listening(port)

        wait_until(head_up, 180, lambda: (tmp_path / "head.log").read_text()[-3000:], 1.0)
        steps = 60
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, f"127.0.0.1:{port}", str(tmp_path / "run"), str(steps)],
            env=env, capture_output=True, text=True, timeout=1500,
        )  # fmt: skip
        assert driver.returncode == 0, driver.stderr[-4000:]
        # Ray's autoscaler may print after the result line ("Resized to 3 CPUs.")
        result = json.loads(driver.stdout.split("RESULT ", 1)[1].splitlines()[0])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # the head and every node it started
        head.wait()
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    metrics = read_table(tmp_path / "run" / "metrics.parquet")
    # every step trained exactly once, within the bound
    assert [r["step"] for r in metrics] == list(range(steps))
    assert [s for s, _ in result["record"]] == list(range(steps))
    assert all(r["step"] == r["version"] for r in metrics)  # k = 0
    # one rollout node at the start, a second one under demand, back to one when idle
    nodes = result["nodes"]
    assert nodes[0] <= 2, nodes
    assert max(nodes) == 2, nodes
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "generator_pool" and e["action"] == "add" for e in events)
    assert result["after"] == [1], result
