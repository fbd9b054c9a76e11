"""What a learner's rewind resets, as pure code: the rows waiting for evaluations and the
launch rule go back to the checkpoint's step, and each loss the summary reports costs the
updates/hour its lost seconds would have bought."""

import math

import pytest

from opdflow.analysis.faults import learner_losses
from opdflow.commands.console import learner_losses_line
from opdflow.core.launch import Launches
from opdflow.core.staleness import FixedStaleness
from opdflow.driver.recorder import RowQueue


def _res(v: int) -> dict:
    return {v: {"heldout_version": v, "heldout_kl": 1.0 / (v + 1), "heldout_accuracy": 0.5}}


def test_rows_after_the_checkpoint_are_replayed_with_the_new_timelines_evaluations():
    out: list[dict] = []
    q = RowQueue(lambda v: v % 2 == 0, out.append)
    q.push({"step": 0}, _res(0))  # row 0 carries version 0 (version 1 is not evaluated)
    q.push({"step": 1}, {})  # waits for version 2
    q.push({"step": 2}, _res(2))  # rows 1, 2 leave; row 2 carries nothing (3 not evaluated)
    q.push({"step": 3}, {})  # waits for version 4 of the old timeline ...
    q.rewind(2)  # ... which will never come: the learner rewound to step 2
    assert [r["step"] for r in out] == [0, 1, 2]
    q.push({"step": 2}, {})  # replayed: row 2 again, then row 3 with the new version 4
    q.push({"step": 3}, _res(4))
    assert [r["step"] for r in out] == [0, 1, 2, 2, 3]
    assert out[-1]["heldout_version"] == 4


def test_a_rewind_to_the_start_carries_version_zeros_evaluation_again():
    out: list[dict] = []
    q = RowQueue(lambda v: v in (0, 4), out.append)
    q.push({"step": 0}, _res(0))
    q.push({"step": 1}, {})
    q.rewind(0)  # lost before the first checkpoint: replay from the start
    q.push({"step": 0}, {})  # version 0 was evaluated once; its row leaves again at once
    assert [(r["step"], r["heldout_version"]) for r in out] == [(0, 0), (1, -1), (0, 0)]


def test_launches_rewind_to_the_checkpoint_and_its_dropped_count():
    gate = Launches(FixedStaleness(2), steps=10)
    assert [s for s, _ in gate.due(latest=3)] == [0, 1, 2, 3, 4, 5]
    gate.dropped = 3
    gate.rewind(4, dropped=1)
    assert gate.dropped == 1
    assert gate.due(latest=4) == [(4, 4), (5, 4), (6, 4)]  # launched again, from version 4


def _recovered(**kw):
    e = {"event": "learner_recovered", "from_step": 15, "to_step": 10, "replayed_steps": 5,
         "recover_s": 20.0, "wasted_s": 10.0, "ranks": [1],
         "nodes": [{"node": "198.18.0.12", "node_id": "n2", "node_alive": False}],
         "workers_before": 2, "workers_after": 1}  # fmt: skip
    return {**e, **kw}


def test_a_loss_costs_the_updates_per_hour_its_seconds_would_have_bought():
    # 36 timed steps at 360 updates/hour: 360 s of wall; 30 s lost -> 36 in 330 s
    (loss,) = learner_losses([{"event": "checkpoint"}, _recovered()], 360.0, 36)
    assert loss["lost_s"] == 30.0 and loss["lost_share"] == pytest.approx(30 / 360)
    assert loss["updates_per_hour_lost"] == pytest.approx(3600 * 36 / 330 - 360)
    assert (loss["from_step"], loss["to_step"], loss["replayed_steps"]) == (15, 10, 5)
    assert math.isnan(learner_losses([_recovered()], 0.0, 36)[0]["updates_per_hour_lost"])


def test_the_summary_line_names_each_loss():
    s = {"learner_losses": learner_losses([_recovered()], 360.0, 36)}
    assert learner_losses_line(s) == (
        "rank 1 (node 198.18.0.12) lost at step 15, rewound to 10: 5 steps replayed, "
        "recovered in 20.0 s, cost 33 updates/hour (8.3%)"
    )
    assert learner_losses_line({"learner_losses": []}) == "none"
    assert learner_losses_line({}).startswith("n/a")
