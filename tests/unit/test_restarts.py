"""Restarts on the record: new restarts from Ray's count per actor, the share of
updates/hour they cost, and the summary table's line that flags a slowed run."""

from __future__ import annotations

import math

from opdflow.analysis.faults import restart_slowdown
from opdflow.cluster.restarts import RESTART_FLAG_SHARE, RestartLog
from opdflow.commands.console import restarts_line


class _Actor:
    def __init__(self, hex_id):
        self._actor_id = type("Id", (), {"hex": lambda self: hex_id})()


def test_each_new_restart_is_reported_once_with_its_stage_and_step():
    counts = {"g0": 0, "g1": 0, "t": 0}
    log = RestartLog(count=lambda a: counts[a._actor_id.hex()])
    actors = {"generator[0]": _Actor("g0"), "generator[1]": _Actor("g1"), "teacher": _Actor("t")}
    assert log.poll(actors, 0) == []
    counts.update(g1=2, t=1)
    hits = log.poll(actors, 3)
    assert [(h["actor"], h["stage"], h["step"], h["ray_restarts"]) for h in hits] == [
        ("generator[1]", "generator", 3, 1),
        ("generator[1]", "generator", 3, 2),
        ("teacher", "teacher", 3, 1),
    ]
    assert log.poll(actors, 4) == []  # seen already
    actors["generator[1]"] = _Actor("g9")  # a replaced replica is a new actor
    counts["g9"] = 0
    assert log.poll(actors, 5) == [] and log.per_stage == {"generator": 2, "teacher": 1}


def _rows(step_s, restarts):
    return [
        {"step": i, "step_s": s, "restarts": r} for i, (s, r) in enumerate(zip(step_s, restarts))
    ]


def test_slowdown_is_the_updates_per_hour_lost_on_hit_steps():
    assert restart_slowdown(_rows([1.0] * 6, [0] * 6)) == 0.0
    # steps 2 and 3 (hit, and the one after) took 5 s instead of 1 s: mean 2.33 s vs 1 s
    slowed = restart_slowdown(_rows([1, 1, 5, 5, 1, 1], [0, 0, 1, 0, 0, 0]))
    assert slowed == 1 - 1 / (14 / 6)
    # a slow warm-up step (actors starting) is not counted as clean time
    warm = _rows([9, 1, 5, 5, 1, 1], [0, 0, 1, 0, 0, 0])
    assert restart_slowdown(warm, warmup=1) == 1 - 1 / (13 / 5)
    assert math.isnan(restart_slowdown(_rows([1, 1], [1, 1])))


def test_the_summary_line_flags_a_run_slowed_by_restarts():
    assert restarts_line({}).startswith("n/a")
    assert restarts_line({"restarts": {}, "restart_slowdown": 0.0}) == "none"
    line = restarts_line({"restarts": {"teacher": 1, "generator": 2}, "restart_slowdown": 0.57})
    assert line == "generator 2, teacher 1: cost 57.0% of updates/hour (RESTARTS SLOWED THIS RUN)"
    cheap = {"restarts": {"generator": 1}, "restart_slowdown": RESTART_FLAG_SHARE / 2}
    assert "SLOWED" not in restarts_line(cheap)
