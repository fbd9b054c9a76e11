"""Metrics rows wait for the held-out evaluation they carry, then leave in step order."""

import math

from opdflow.driver.recorder import RowQueue


def _queue(every: int, steps: int, first: int = 0):
    out: list[dict] = []

    def evaluated(v: int) -> bool:
        return v == 0 or v % every == 0 or v == steps

    return RowQueue(evaluated, out.append, first), out


def _res(v: int) -> dict:
    return {v: {"heldout_version": v, "heldout_kl": 1.0 / (v + 1), "heldout_accuracy": 0.5}}


def test_every_evaluation_lands_on_its_row_even_when_it_finishes_late():
    q, out = _queue(every=2, steps=5)
    q.push({"step": 0}, {})  # version 1 is not evaluated: row 0 waits for version 0
    assert out == []
    q.push({"step": 1}, _res(0))  # row 1 carries version 2, not finished yet
    assert [r["step"] for r in out] == [0]
    q.push({"step": 2}, {})
    q.push({"step": 3}, _res(2))  # late: rows 1..2 leave now, row 3 waits for version 4
    assert [r["step"] for r in out] == [0, 1, 2]
    q.push({"step": 4}, {})
    q.push(None, {**_res(4), **_res(5)})  # the final wait=True collection
    assert [r["step"] for r in out] == [0, 1, 2, 3, 4]
    assert [r["heldout_version"] for r in out] == [0, 2, -1, 4, 5]
    assert math.isnan(out[2]["heldout_kl"]) and out[4]["heldout_kl"] == 1.0 / 6


def test_every_step_evaluated_and_resume_without_version_zero():
    q, out = _queue(every=1, steps=3)
    for s in range(3):
        q.push({"step": s}, _res(s + 1))
    assert [r["heldout_version"] for r in out] == [1, 2, 3]
    q, out = _queue(every=10, steps=30, first=10)  # resumed at step 10: version 0 not re-run
    q.push({"step": 10}, {})
    assert out[0]["heldout_version"] == -1
