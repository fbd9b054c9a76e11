"""Runs that span the nodes of a namespaced cluster, submitted with `opdflow submit` from
the root namespace: the demo with its learner's 2 ranks on two nodes and the generators
on a third equals the single-node run; the dapo_math CPU variant over the collective
transport; a stage that cannot start says why in one line."""

from __future__ import annotations

import json
import shutil

import pytest
from support.netcluster import (
    ACROSS_NODES,
    DEMO_SIZE,
    DEMO_SYNC,
    ROOT,
    assert_same_metrics,
    opdflow_cli,
    submit,
)

from opdflow.record.rundir import read_table

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def netcluster(shared_netcluster):
    """The session's three nodes: these tests leave them as they found them."""
    return shared_netcluster


def _events(run, kind):
    return [e for e in (json.loads(x) for x in (run / "events.jsonl").read_text().splitlines())
            if e["event"] == kind]  # fmt: skip


def test_demo_across_three_nodes_equals_one_node(netcluster, single_node_demo):
    storage = netcluster.shared / "runs"
    res, job = submit(netcluster, DEMO_SYNC,
                      [*DEMO_SIZE, *ACROSS_NODES, "--storage", str(storage), "--run-dir", "demo"])  # fmt: skip
    assert res.exit_code == 0, res.output[-3000:]
    run = storage / "demo"
    head, learner_b, rollout = netcluster.nodes
    (ranks,) = _events(run, "learner_ranks")
    assert [r["node"] for r in ranks["ranks"]] == [head.ip, learner_b.ip]
    (placed,) = _events(run, "placement")
    assert placed["actors"]["generator[0]"] == rollout.ip
    assert_same_metrics(read_table(run / "metrics.parquet"), single_node_demo)
    status = opdflow_cli(netcluster, ["status", job])
    assert f"{job}: SUCCEEDED" in status.output and f"run directory: {run}" in status.output
    logs = opdflow_cli(netcluster, ["logs", job])
    assert f"run directory: {run}" in logs.output


def _dapo_cpu(netcluster, tiny) -> list[str]:
    """pipelines/dapo_math.py:student_1p5b's CPU variant (as tests/integration runs it),
    its checkpoints and data on the shared storage, placed across the nodes."""
    models = netcluster.shared / "models"
    for part in ("student", "teacher"):
        if not (models / part).exists():
            shutil.copytree(getattr(tiny, part), models / part)
            shutil.copytree(tiny.tokenizer, models / part, dirs_exist_ok=True)
    for name in ("train", "heldout"):
        if not (models / f"{name}.parquet").exists():
            shutil.copy(getattr(tiny, name), models / f"{name}.parquet")
    cpu = ("num_gpus=0", "num_cpus=0.25", "torch_threads=1")
    return [
        "--set", f"models.student={models / 'student'}", "--set", f"models.teacher={models / 'teacher'}",
        "--set", f"data.train={models / 'train.parquet'}", "--set", f"data.heldout={models / 'heldout.parquet'}",
        "--set", "data.prompts_per_step=3", "--set", "data.max_prompt_tokens=16",
        "--set", "engine.kind=torch", "--set", "engine.replicas=1", "--set", "engine.max_new_tokens=8",
        "--set", "train.micro_batch_tokens=48", "--set", "eval.prompts=8", "--set", "eval.every=3",
        "--set", "eval.batch_prompts=3", "--set", "reliability.startup_timeout_s=600",
        "--set", "resources.placement.groups=[]",
        *(x for stage in ("generator", "learner", "rescorer", "teacher", "evaluator")
          for kv in cpu for x in ("--set", f"resources.{stage}.{kv}")),
        *ACROSS_NODES,
    ]  # fmt: skip


DAPO = f"{ROOT}/pipelines/dapo_math.py:student_1p5b"


def test_dapo_cpu_variant_across_nodes_over_the_collective_transport(netcluster, tiny):
    storage = netcluster.shared / "runs"
    args = [*_dapo_cpu(netcluster, tiny), "--set", "weights.transport=collective", "--steps", "3"]
    res, _ = submit(netcluster, DAPO, [*args, "--storage", str(storage), "--run-dir", "dapo"])
    assert res.exit_code == 0, res.output[-3000:]
    run = storage / "dapo"
    (ranks,) = _events(run, "learner_ranks")
    assert len({r["node"] for r in ranks["ranks"]}) == 2
    (weights,) = _events(run, "weights")
    assert weights["generator"] == "collective/gloo"
    rows = read_table(run / "metrics.parquet")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["micro_batches"] >= 4 for r in rows)  # several per rank, 2 ranks
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*/*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]  # fmt: skip


def test_a_stage_that_cannot_start_says_why(netcluster, tiny):
    """The student only in the head's own /tmp: the driver reads it there, the learner rank
    and the generator on other nodes cannot. The run stops at once with the actor's own
    error, not a resources hint after the start-up timeout."""
    head = netcluster.nodes[0]
    _dapo_cpu(netcluster, tiny)
    student = netcluster.shared / "models" / "student"
    netcluster.run_in(head, ["cp", "-r", str(student), "/tmp/student-on-head-only"])
    args = [*_dapo_cpu(netcluster, tiny), "--set", "models.student=/tmp/student-on-head-only"]
    res, job = submit(netcluster, DAPO, [*args, "--storage", str(netcluster.shared / "runs")])
    assert res.exit_code == 1
    status = opdflow_cli(netcluster, ["status", job])
    line = status.output.splitlines()[0]
    assert line.startswith(f"{job}: FAILED: error: stage "), status.output
    assert "did not start" in line and "/tmp/student-on-head-only" in line, line
    assert "they request" not in status.output
