"""A learner that heals itself, on the embedded cluster: a rank of a 2-rank learner is
SIGKILLed after the step-10 checkpoint, at about step 15. The run goes on without a person
(a new group from the last committed checkpoint, the loop rewound to it), trains every
step once within the bound, and at k = 0 ends where the uninterrupted run ends, within
float tolerance; events.jsonl and the summary hold the loss, the rewind and its cost. More
losses than reliability.max_learner_recoveries end the run naming the checkpoint and the
resume command."""

import math
import os
import signal

import pytest
import ray
from support.replay import assert_replayed

from opdflow.cluster.supervisor import StageFailed
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.checkpoint import checkpoints_dir, load_latest
from opdflow.record.rundir import RunDir, read_table

STEPS = 20


def _cfg(k=0, extra=()):
    return apply_overrides(
        PipelineConfig(name="heal", seed=5),
        [
            f"staleness.k={k}",
            f"train.steps={STEPS}",
            "resources.learner.workers=2",
            "resources.learner.num_cpus=0.5",
            "eval.every=10",  # row 14 is emitted at once: the kill lands before step 15
            "eval.prompts=8",
            "reliability.checkpoint_every=10",
            "reliability.learner_recovery_timeout_s=60",
            *extra,
        ],
    )


class RankKiller:
    """SIGKILLs one learner rank's process once `at` steps are done and the checkpoint of
    step `after` is committed (written in the background, it may commit a step or two
    late); again for each further (at, after), counted on the timeline it heals onto."""

    def __init__(self, rank, root, *when):
        self.rank, self.root, self.when = rank, root, list(when)
        self.stages = None
        self.killed_after = []

    def on_start(self, st):
        self.stages = st

    def on_step(self, row):
        done = row["step"] + 1
        if not self.when or done < self.when[0][0]:
            return
        ckpt = load_latest(self.root)
        if ckpt is None or ckpt.step < self.when[0][1]:
            return
        rank = ray.get(self.stages.learner.ranks.remote(), timeout=120)[self.rank]
        os.kill(ray.get(rank.pid.remote(), timeout=120), signal.SIGKILL)
        self.killed_after.append(done)
        self.when.pop(0)


def _events(run, kind):
    return [e for e in run.events() if e["event"] == kind]


def _assert_every_step_once_within(summary, metrics, k):
    assert [r["step"] for r in metrics] == list(range(STEPS))  # replayed rows replaced
    assert all(0 <= r["step"] - r["version"] <= k for r in metrics)
    assert [s for s, _ in summary["trained_steps_record"]] == list(range(STEPS))


@pytest.fixture(scope="module")
def uninterrupted(ray_local, tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("heal") / "full"
    summary = run_pipeline(_cfg(), RunDir.create(_cfg(), path))
    return summary, read_table(path / "metrics.parquet"), path


@pytest.mark.slow
def test_a_killed_learner_rank_heals_and_a_sync_replay_matches(uninterrupted, tmp_path):
    cfg = _cfg()
    killer = RankKiller(1, checkpoints_dir(tmp_path / "run"), (15, 10))
    run = RunDir.create(cfg, tmp_path / "run")
    summary = run_pipeline(cfg, run, on_step=killer.on_step, on_start=killer.on_start)

    (killed_after,) = killer.killed_after
    metrics = read_table(run.path / "metrics.parquet")
    _assert_every_step_once_within(summary, metrics, 0)
    (lost,) = _events(run, "learner_lost")
    assert lost["ranks"] == [1] and lost["workers"] == 2 and lost["nodes"]
    (healed,) = _events(run, "learner_recovered")
    assert (healed["from_step"], healed["to_step"]) == (killed_after, 10)
    assert healed["replayed_steps"] == killed_after - 10
    assert healed["workers_before"] == healed["workers_after"] == 2  # room for both again
    assert healed["recover_s"] > 0 and healed["timeline"] == 1
    assert [e["step"] for e in _events(run, "rewind")] == [10]
    (cost,) = summary["learner_losses"]
    assert cost["replayed_steps"] == healed["replayed_steps"]
    assert cost["lost_s"] >= cost["recover_s"] > 0 and math.isfinite(cost["updates_per_hour_lost"])

    full_summary, full, _ = uninterrupted  # k = 0: the replay trains what was lost
    assert_replayed(full, metrics)
    assert summary["heldout_kl_end"] == pytest.approx(full_summary["heldout_kl_end"], rel=1e-3)


@pytest.mark.slow
def test_a_lost_publisher_heals_on_the_collective_transport_until_losses_run_out(
    ray_local, tiny, tmp_path
):
    """Rank 0 holds the weights publisher: its consumers pair again with the new rank 0.
    The second loss is one more than allowed: the run ends naming its last checkpoint."""
    k = 2
    cfg = _cfg(k, ["train.steps=14", "reliability.checkpoint_every=4",
                   "reliability.max_learner_recoveries=1", "weights.transport=collective"])  # fmt: skip
    killer = RankKiller(0, checkpoints_dir(tmp_path / "run"), (6, 4), (10, 8))
    run = RunDir.create(cfg, tmp_path / "run")
    with pytest.raises(StageFailed) as failed:
        run_pipeline(cfg, run, on_step=killer.on_step, on_start=killer.on_start)

    assert len(killer.killed_after) == 2
    assert [e["ranks"] for e in _events(run, "learner_lost")] == [[0], [0]]  # not its peer
    (healed,) = _events(run, "learner_recovered")
    assert healed["to_step"] >= 4 and healed["workers_after"] == 2
    moved = _events(run, "weights")[0]
    assert moved["generator"] == "collective/gloo"
    metrics = read_table(run.path / "metrics.parquet")  # trained once, within the bound
    assert [r["step"] for r in metrics] == list(range(len(metrics))) and len(metrics) >= 10
    assert all(0 <= r["step"] - r["version"] <= k for r in metrics)
    text = str(failed.value)
    assert "stage learner failed: lost rank(s) [0]" in text
    assert (
        "learner loss 2 and the run heals from at most reliability.max_learner_recoveries = 1"
        in text
    )
    ckpt = load_latest(checkpoints_dir(run.path))
    assert ckpt.step >= 8
    assert f"({ckpt.path}, step {ckpt.step}) with: opdflow run PIPELINE --resume {run.path}" in text


def test_a_consumer_fetches_a_new_timelines_version_of_the_same_number(ray_local, tiny, tokenizer):
    """A generator at version 3 of the first timeline fetches version 3 of the next (the
    learner healed and replayed up to it): same number, other weights."""
    import dataclasses

    import torch

    from opdflow.inputs.models import load_model
    from opdflow.stages.generator import GeneratorWorker
    from opdflow.stages.specs import GeneratorSpec
    from opdflow.weights.transport import put_version
    from opdflow.weights.version import pack

    def state(path):
        model = load_model(str(path), "bfloat16")
        return {n: t.detach().clone() for n, t in model.state_dict().items()}

    def engine_state(actor):
        return {n: t.detach().clone() for n, t in actor.engine.model.state_dict().items()}

    old, new = state(tiny.student), state(tiny.teacher)
    worker = (
        ray.remote(GeneratorWorker)
        .options(num_cpus=0)
        .remote(GeneratorSpec(str(tiny.student), tokenizer.pad_token_id, tokenizer.eos_token_id))
    )  # fmt: skip
    v3_old = put_version(pack(old, 3))
    v3_new = dataclasses.replace(put_version(pack(new, 3)), timeline=1)
    assert ray.get(worker.load.remote(v3_old)) == 3
    assert ray.get(worker.load.remote(dataclasses.replace(v3_new, timeline=0))) == 3  # kept
    held = ray.get(worker.__ray_call__.remote(engine_state))
    assert all(torch.equal(held[n].to(torch.bfloat16), old[n]) for n in old)
    assert ray.get(worker.load.remote(v3_new)) == 3  # fetched: another timeline's version 3
    held = ray.get(worker.__ray_call__.remote(engine_state))
    assert all(torch.equal(held[n].to(torch.bfloat16), new[n]) for n in new)
    ray.kill(worker)
