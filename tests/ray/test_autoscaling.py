"""Rollout nodes follow the generator pool: Ray's fake autoscaling cluster, one run.

`ray.cluster_utils.AutoscalingCluster` starts a head plus a `rollout` node type (min 1,
max 2) whose nodes the autoscaler adds for pending generator replicas and removes when
idle. Its wheel lacks the example config it reads, so the test gives it a full inline one.

Its start and shutdown run `ray stop --force`, which stops EVERY Ray process on the
machine: the test refuses to run while Ray processes other than this pytest's own
exist (a shared development machine); on a CI machine it runs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import ray

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


def _other_ray_processes() -> list[str]:
    """Ray daemons and workers running on this machine (Linux /proc)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(k in cmd for k in ("gcs_server", "raylet/raylet", "ray::")):
            found.append(f"{proc.name}: {cmd[:80]}")
    return found


def _rollout_nodes() -> int:
    return sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("rollout", 0) > 0)


@pytest.mark.slow
def test_rollout_nodes_scale_up_and_down_within_one_run(tiny, tmp_path, monkeypatch):
    from ray.cluster_utils import AutoscalingCluster

    from opdflow.config import PipelineConfig, apply_overrides
    from opdflow.controller import run_pipeline
    from opdflow.rundir import RunDir, read_table

    if ray.is_initialized():
        ray.shutdown()  # this session's own embedded cluster, if any
    time.sleep(2)
    others = _other_ray_processes()
    if others:
        pytest.skip(
            "other Ray processes run on this machine and AutoscalingCluster runs "
            f"`ray stop --force`, which would kill them: {others[:3]}"
        )

    class InlineAutoscalingCluster(AutoscalingCluster):
        def _generate_config(self, head_resources, worker_node_types, **kw):
            return json.loads(json.dumps(FAKE_CONFIG))

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = InlineAutoscalingCluster(head_resources={"CPU": 2}, worker_node_types={})
    cluster.start()
    try:
        ray.init("auto", configure_logging=False)
        deadline = time.time() + 60
        while _rollout_nodes() < 1:  # min_workers: one rollout node before the run
            assert time.time() < deadline, ray.nodes()
            time.sleep(1)
        steps = 60
        cfg = apply_overrides(
            PipelineConfig(name="autoscale"),
            [
                f"train.steps={steps}", f"eval.every={steps}", "eval.prompts=8",
                "staleness.k=2", "engine.replicas=1", "engine.min_replicas=1",
                "engine.max_replicas=2", "engine.scale_down_idle_s=2",
                "resources.generator.num_cpus=0",
                'resources.generator.resources={"rollout": 1}',
            ],
        )  # fmt: skip
        nodes: list[int] = []
        run = RunDir.create(cfg, tmp_path / "run")
        summary = run_pipeline(cfg, run, on_step=lambda row: nodes.append(_rollout_nodes()))
        metrics = read_table(run.path / "metrics.parquet")
        # every step trained exactly once, within the bound
        assert [r["step"] for r in metrics] == list(range(steps))
        assert [s for s, _ in summary["trained_steps_record"]] == list(range(steps))
        assert all(0 <= r["step"] - r["version"] <= 2 for r in metrics)
        # one rollout node at the start, a second one under demand
        assert nodes[0] <= 2 and max(nodes) == 2, nodes
        events = [json.loads(x) for x in (run.path / "events.jsonl").read_text().splitlines()]
        pool = [e for e in events if e["event"] == "generator_pool"]
        assert any(e["action"] == "add" for e in pool), pool
        # and back down: the idle node leaves (idle_timeout_minutes=0.1)
        deadline = time.time() + 90
        while _rollout_nodes() > 1:
            assert time.time() < deadline, ray.nodes()
            time.sleep(2)
    finally:
        ray.shutdown()
        cluster.shutdown()
