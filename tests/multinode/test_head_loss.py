"""A head-node loss ends the run (the GCS, the dashboard and the job's driver die with
it); the run directory and checkpoints on the shared storage survive, and `opdflow submit
--resume` on the restarted cluster continues it: at k = 0 its metrics equal the
uninterrupted single-node run's."""

from __future__ import annotations

import json

import pytest
from support.netcluster import (
    ACROSS_NODES,
    DEMO_SIZE,
    DEMO_SYNC,
    assert_same_metrics,
    submit,
    wait_for_step,
)

from opdflow.runtime.rundir import read_table

pytestmark = pytest.mark.slow


def test_head_loss_ends_the_run_and_resume_continues_it(netcluster, single_node_demo):
    storage = netcluster.shared / "runs"
    where = [*DEMO_SIZE, *ACROSS_NODES, "--storage", str(storage)]
    res, _ = submit(netcluster, DEMO_SYNC, [*where, "--run-dir", "head-lost"], wait=False)
    assert res.exit_code == 0, res.output
    run = storage / "head-lost"
    wait_for_step(run, 4)  # the step-4 checkpoint is written before step 4's row
    netcluster.kill_node(netcluster.head)
    trained = len(read_table(run / "metrics.parquet"))
    assert trained < 8, "the run finished before its head was killed"
    netcluster.restart()  # a new cluster on the same machines and storage
    res, _ = submit(netcluster, DEMO_SYNC, [*where, "--resume", "head-lost"])
    assert res.exit_code == 0, res.output[-3000:]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "resume"] == [4]
    assert_same_metrics(read_table(run / "metrics.parquet"), single_node_demo)
