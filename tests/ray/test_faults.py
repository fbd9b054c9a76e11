"""Fault injection: stage processes are SIGKILLed (or SIGSTOPped) at random points of
short tiny runs; every run must still train each step exactly once within the bound."""

import json
import os
import random
import signal

import pytest
import ray

from opdflow.cluster.supervisor import StageFailed
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.rundir import RunDir, read_table

STEPS = 10


def _cfg(k, extra=()):
    return apply_overrides(
        PipelineConfig(name="faults"),
        [
            f"staleness.k={k}",
            f"train.steps={STEPS}",
            "eval.every=5",
            "eval.prompts=8",
            "engine.replicas=2",
            "reliability.checkpoint_every=0",
            "reliability.max_restarts=10",
            *extra,
        ],
    )


class Killer:
    """Kills a seeded-random stage actor's process after chosen steps."""

    def __init__(self, seed, kills):
        self.rng = random.Random(seed)
        self.at = sorted(self.rng.sample(range(STEPS - 1), kills))
        self.killed = []
        self.stages = None

    def on_start(self, st):
        self.stages = st

    def on_step(self, row):
        for _ in range(self.at.count(row["step"])):
            st = self.stages
            actors = {f"generator[{i}]": w for i, w in enumerate(st.pool.workers)}
            actors.update(rescorer=st.rescorer, teacher=st.teacher, evaluator=st.evaluator)
            name = self.rng.choice(sorted(actors))
            pid = ray.get(actors[name].pid.remote(), timeout=120)
            os.kill(pid, signal.SIGKILL)
            self.killed.append((row["step"], name))


def _check_exactly_once_within_bound(summary, run, k):
    metrics = read_table(run.path / "metrics.parquet")
    assert [r["step"] for r in metrics] == list(range(STEPS))  # none missing, none duplicated
    assert all(0 <= r["step"] - r["version"] <= k for r in metrics)
    record = summary["trained_steps_record"]  # the learner's own record
    assert [s for s, _ in record] == list(range(STEPS))
    assert [v for _, v in record] == [r["version"] for r in metrics]


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "k"), [(11, 0), (12, 2)])
def test_runs_survive_killed_stage_processes(seed, k, tmp_path, ray_local, tiny):
    killer = Killer(seed, kills=5)  # sync and async: 10 kills per suite run
    cfg = _cfg(k)
    run = RunDir.create(cfg, tmp_path / "run")
    summary = run_pipeline(cfg, run, on_step=killer.on_step, on_start=killer.on_start)
    assert len(killer.killed) == 5
    _check_exactly_once_within_bound(summary, run, k)
    assert summary["heldout_version_end"] == STEPS
    killed: dict[str, int] = {}
    for _, name in killer.killed:
        killed[name.split("[")[0]] = killed.get(name.split("[")[0], 0) + 1
    assert summary["restarts"] == killed  # every kill is a restart on the record


@pytest.mark.slow
def test_a_stage_that_stops_answering_is_restarted_after_the_deadline(tmp_path, ray_local, tiny):
    cfg = _cfg(1, ["reliability.stage_timeout_s=5"])
    stopped = []

    def on_step(row):
        if row["step"] == 3:
            pid = ray.get(stages[0].rescorer.pid.remote())
            os.kill(pid, signal.SIGSTOP)  # alive but silent
            stopped.append(pid)

    stages = []
    run = RunDir.create(cfg, tmp_path / "run")
    summary = run_pipeline(cfg, run, on_step=on_step, on_start=stages.append)
    assert stopped
    _check_exactly_once_within_bound(summary, run, 1)
    events = [json.loads(line) for line in (run.path / "events.jsonl").read_text().splitlines()]
    assert {"timeout"} <= {e["event"] for e in events}
    assert any(e["event"] == "timeout" and e["stage"] == "rescorer" for e in events)
    kills = [e for e in events if e["event"] == "timeout" and e["action"] == "killed"]
    assert {e["stage"] for e in kills} == {"rescorer"}
    assert summary["restarts"] == {"rescorer": len(kills)}  # each kill at a deadline: a restart


@pytest.mark.slow
def test_a_stage_dying_past_its_restart_limit_stops_the_run_naming_it(tmp_path, ray_local, tiny):
    cfg = _cfg(1, ["reliability.max_restarts=1"])
    kills = []

    def on_step(row):
        if row["step"] in (1, 3):
            pid = ray.get(stages[0].teacher.pid.remote(), timeout=120)
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)

    stages = []
    run = RunDir.create(cfg, tmp_path / "run")
    with pytest.raises(StageFailed, match=r"stage teacher failed: .*Actor.*max_restarts"):
        run_pipeline(cfg, run, on_step=on_step, on_start=stages.append)
    assert len(kills) == 2
    for actor in [
        *stages[0].pool.workers,
        stages[0].rescorer,
        stages[0].learner,
        stages[0].evaluator,
    ]:
        ray.kill(actor)


def test_stages_ray_cannot_place_fail_at_startup_instead_of_hanging(tmp_path, ray_local, tiny):
    cfg = _cfg(0, ["resources.learner.num_cpus=64", "reliability.startup_timeout_s=20"])
    run = RunDir.create(cfg, tmp_path / "run")
    with pytest.raises(
        StageFailed,
        # on a loaded machine the placeable stages may still be importing torch at 20 s
        match=r"stage startup failed: (\S+, )*learner(, \S+)* not running after 20 s; "
        r"they request .*learner: 64\.0 CPU.*the cluster has",
    ):
        run_pipeline(cfg, run)
