"""Node faults on a namespaced cluster. Survived: every process of the generators' node
killed mid-run and a fresh node joining later; the generators' link down for longer than
Ray's health check, then back. Each run finishes with every step trained once within the
staleness bound, and the loss on the record (events.jsonl, summary). Not survived: the
head node's loss (the GCS, the dashboard and the job's driver die with it) ends the run;
its run directory and checkpoints on the shared storage survive, and `opdflow submit
--resume` on the restarted cluster continues it: at k = 0 its metrics equal the
uninterrupted single-node run's. The head loss runs last: it restarts the cluster."""

from __future__ import annotations

import json
import time

import pytest
from support.netcluster import (
    ACROSS_NODES,
    DEMO_SIZE,
    DEMO_SYNC,
    ROOT,
    NodeSpec,
    alive_with,
    assert_same_metrics,
    job_status,
    submit,
    wait_for_step,
)

from opdflow.record.rundir import read_table

pytestmark = pytest.mark.slow

DEMO = f"{ROOT}/pipelines/tiny_cpu.py"
"""The demo as shipped: k = 2."""


def _events(run):
    return [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]


def _every_step_once_within_the_bound(run, steps: int, k: int = 2) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    rows = read_table(run / "metrics.parquet")
    assert [r["step"] for r in rows] == list(range(steps))
    assert [tuple(x) for x in summary["trained_steps_record"]] == [
        (r["step"], r["version"]) for r in rows
    ]  # each step trained once: the learner's own record agrees
    assert all(0 <= r["step"] - r["version"] <= k for r in rows)
    return summary


def _start(netcluster, name: str, steps: int) -> tuple[str, object]:
    storage = netcluster.shared / "runs"
    args = ["--steps", str(steps), "--set", f"eval.every={steps // 2}", "--set", "eval.prompts=16",
            *ACROSS_NODES, "--storage", str(storage), "--run-dir", name]  # fmt: skip
    res, job = submit(netcluster, DEMO, args, wait=False)
    assert res.exit_code == 0, res.output
    return job, storage / name


def test_the_generators_node_is_killed_and_a_fresh_one_joins(netcluster):
    job, run = _start(netcluster, "node-killed", 40)
    wait_for_step(run, 10)
    gen = alive_with(netcluster, "rollout")
    netcluster.kill_node(gen)  # every process of the node, as a machine losing power
    killed = time.time()
    time.sleep(10)
    fresh = netcluster.add_node(NodeSpec("rollout-2", 2, {"rollout": 1}))
    assert job_status(netcluster, job) == "SUCCEEDED"
    summary = _every_step_once_within_the_bound(run, 40)
    events = _events(run)
    (lost,) = [e for e in events if e["event"] == "node_lost"]
    assert lost["node"] == gen.ip and "generator" in lost["stages"]
    waits = [e for e in events if e["event"] == "waiting" and e["node_lost"] == gen.ip]
    assert waits and "no alive node has" in waits[0]["message"]
    assert "rollout" in waits[0]["message"]  # what it waits for: a node with that resource
    assert any(e["event"] == "node_joined" and e["node"] == fresh.ip for e in events)
    (back,) = [e for e in events if e["event"] == "node_recovered"]
    assert back["node"] == gen.ip and back["seconds"] > 0
    (loss,) = summary["node_losses"]
    print("node loss:", json.dumps({**loss, "seconds_from_kill": round(back["time"] - killed, 1)}))
    assert loss["node"] == gen.ip and loss["seconds_to_recover"] == back["seconds"]
    assert loss["steps_replayed"] == len(lost["steps_replayed"])
    assert loss["updates_per_hour_lost"] >= 0
    assert summary["restarts"].get("generator", 0) >= 1


def test_a_link_down_longer_than_the_health_check(netcluster):
    job, run = _start(netcluster, "link-down", 20)
    wait_for_step(run, 6)
    gen = alive_with(netcluster, "rollout")
    netcluster.link(gen, up=False)  # a partition: its processes run on, unreachable
    down = time.time()
    netcluster.wait_dead(gen.ip, timeout_s=4 * netcluster.health.window_s + 60)
    netcluster.link(gen, up=True)
    # Ray declared the node dead: its raylet cannot rejoin; the machine's Ray starts again
    netcluster.restart_node(gen)
    assert job_status(netcluster, job) == "SUCCEEDED"
    summary = _every_step_once_within_the_bound(run, 20)
    events = _events(run)
    (lost,) = [e for e in events if e["event"] == "node_lost"]
    assert lost["node"] == gen.ip and "generator" in lost["stages"]
    (back,) = [e for e in events if e["event"] == "node_recovered" and e["node"] == gen.ip]
    (loss,) = summary["node_losses"]
    print(
        "link down:", json.dumps({**loss, "seconds_from_link_down": round(back["time"] - down, 1)})
    )


def test_head_loss_ends_the_run_and_resume_continues_it(netcluster, single_node_demo):
    storage = netcluster.shared / "runs"
    where = [*DEMO_SIZE, *ACROSS_NODES, "--storage", str(storage)]
    res, _ = submit(netcluster, DEMO_SYNC, [*where, "--run-dir", "head-lost"], wait=False)
    assert res.exit_code == 0, res.output
    run = storage / "head-lost"
    wait_for_step(run, 4)  # the step-4 checkpoint is written before step 4's row
    netcluster.kill_node(netcluster.head)
    killed = time.time()
    trained = len(read_table(run / "metrics.parquet"))
    assert trained < 8, "the run finished before its head was killed"
    netcluster.restart()  # a new cluster on the same machines and storage
    res, _ = submit(netcluster, DEMO_SYNC, [*where, "--resume", "head-lost"])
    assert res.exit_code == 0, res.output[-3000:]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    (resumed,) = [e for e in events if e["event"] == "resume"]
    assert resumed["step"] == 4
    assert_same_metrics(read_table(run / "metrics.parquet"), single_node_demo)
    print("head loss:", json.dumps({"trained_before": trained, "resumed_at": 4,
                                    "steps_replayed": trained - 4,
                                    "seconds_to_resume": round(resumed["time"] - killed, 1)}))  # fmt: skip
