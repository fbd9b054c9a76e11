"""The data-parallel learner (2 CPU ranks, gloo, FSDP2, micro-batches) trains like one
unsharded learner on the whole batch: same losses, metrics, FP32 weights and AdamW moments
within float tolerance; its sharded checkpoints cross over 2 -> 1 and 1 -> 2; a batch with
fewer responses than workers is an error naming the fix; a whole pipeline runs with two
learner workers and resumes on one."""

import dataclasses
import json
import math

import pytest
import ray
import torch
from support.batches import sampled_batch

from opdflow.compute.scoring import token_logprobs
from opdflow.config import LearnerResources, PipelineConfig, TrainConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.inputs.models import load_model
from opdflow.record.checkpoint import Checkpoint, checkpoints_dir, read_state
from opdflow.record.rundir import RunDir, read_table
from opdflow.stages.learner_actor import learner_class
from opdflow.stages.specs import LearnerSpec
from opdflow.weights.fetcher import fetch_state

SAME = ("loss", "train_kl", "grad_norm", "entropy", "d_stale_k1", "d_stale_k3", "d_total_k1")
EXACT = ("tokens", "responses", "weights_bytes", "skipped", "d_engine_k1")


@pytest.fixture(scope="module")
def batch(tiny, tokenizer):
    """9 responses (3 prompts x 3)."""
    b = sampled_batch(tiny, tokenizer, prompts=3, n=3, max_new_tokens=6)
    with torch.no_grad():
        teacher, _ = token_logprobs(load_model(str(tiny.teacher), "float32"), b)
    return b.replace(logp_rescore_B_T=b.logp_engine_B_T, logp_teacher_B_T=teacher.numpy())


# centring couples every token of the batch (the learner scores it whole before its update)
WHOLE = TrainConfig(center_advantage=True, micro_batch_tokens=0)  # lr 1e-4
# ~2 rows per micro-batch: 5 micro-batches, rank 1 runs a placeholder beside its two
MICRO = dataclasses.replace(WHOLE, micro_batch_tokens=40)


def _one(tiny):
    return learner_class().options(num_cpus=0.5).remote(LearnerSpec(str(tiny.student), WHOLE))


def _two(tiny):
    return (
        learner_class()
        .options(num_cpus=0.5)
        .remote(
            LearnerSpec(str(tiny.student), MICRO, resources=LearnerResources(workers=2)),
            [{"num_cpus": 0.5}],
        )
    )


def _steps(learner, batch, steps):
    return [ray.get(learner.train_step.remote(s, batch)) for s in steps]


def _assert_same_metrics(a, b):
    for key in SAME:
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
    for key in EXACT:
        assert a[key] == b[key], key


def _assert_same_checkpoint(a, b, atol):
    for prefix in ("model.", "optim.state."):  # FP32 weights; AdamW moments and step
        ta, tb = read_state(a, prefix), read_state(b, prefix)
        assert ta.keys() == tb.keys() and ta, prefix
        for k in ta:
            torch.testing.assert_close(ta[k], tb[k], atol=atol, rtol=1e-5, msg=k)
    ja, jb = (json.loads((d / "learner.json").read_text()) for d in (a, b))
    assert {**ja, "workers": 0} == {**jb, "workers": 0}


def test_two_workers_train_like_one_and_checkpoints_cross_over(ray_local, tiny, batch, tmp_path):
    one, two = _one(tiny), _two(tiny)
    ckpt = {name: tmp_path / name for name in ("one2", "two2", "one3", "two3")}
    runs = {}
    for name, learner in (("one", one), ("two", two)):
        out = _steps(learner, batch, [0, 1])
        ray.get(learner.save_checkpoint.remote(str(ckpt[f"{name}2"])))
        out += _steps(learner, batch, [2])
        ray.get(learner.save_checkpoint.remote(str(ckpt[f"{name}3"])))
        runs[name] = out
    assert [r["micro_batches"] for r in runs["one"]] == [1, 1, 1]
    assert [r["micro_batches"] for r in runs["two"]] == [5, 5, 5]
    for a, b in zip(runs["one"], runs["two"]):
        _assert_same_metrics(a, b)
        assert b["learner_peak_mem_gb"] > 0
    assert runs["one"][0]["loss"] != runs["one"][2]["loss"]  # the steps do move the weights
    _assert_same_checkpoint(ckpt["one2"], ckpt["two2"], atol=1e-5)
    _assert_same_checkpoint(ckpt["one3"], ckpt["two3"], atol=1e-5)
    pub = {n: fetch_state(ray.get(x.publish.remote())) for n, x in (("one", one), ("two", two))}
    assert pub["one"].keys() == pub["two"].keys()
    for k in pub["one"]:  # BF16 of FP32 weights equal to 1e-5: one rounding step apart at most
        torch.testing.assert_close(pub["one"][k], pub["two"][k], msg=k)

    # 2 -> 1: the one-worker learner continues from the two-worker checkpoint
    ray.get(one.load_checkpoint.remote(str(ckpt["two2"]), 2))
    _assert_same_metrics(_steps(one, batch, [2])[0], runs["two"][2])
    ray.kill(one)
    ray.kill(two)

    # 1 -> 2: a fresh two-worker learner (no optimizer state yet) continues from one worker's
    fresh = _two(tiny)
    ray.get(fresh.load_checkpoint.remote(str(ckpt["one2"]), 2))
    again = _steps(fresh, batch, [2, 3])
    _assert_same_metrics(again[0], runs["one"][2])
    assert ray.get(fresh.record.remote()) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    with pytest.raises(ray.exceptions.RayTaskError, match=r"resources\.learner\.workers"):
        ray.get(fresh.train_step.remote(4, batch.select([0])))
    ray.kill(fresh)


@pytest.mark.slow
def test_a_pipeline_with_two_learner_workers_runs_and_resumes_on_one(ray_local, tmp_path):
    """`--set resources.learner.workers=2` end to end (k = 0, so steps are deterministic); its
    step-2 checkpoint resumed with one worker trains step 2 as the two workers did."""

    def cfg(workers):
        return apply_overrides(
            PipelineConfig(name="dp", seed=3),
            [
                f"resources.learner.workers={workers}",
                "resources.learner.num_cpus=0.5",
                "staleness.k=0",
                "train.steps=3",
                "eval.every=3",
                "eval.prompts=8",
                "reliability.checkpoint_every=2",
            ],
        )

    path = tmp_path / "run"
    summary = run_pipeline(cfg(2), RunDir.create(cfg(2), path))
    two = read_table(path / "metrics.parquet")
    assert [r["step"] for r in two] == [0, 1, 2]
    assert [s for s, _ in summary["trained_steps_record"]] == [0, 1, 2]
    assert all(math.isfinite(r["loss"]) and not r["skipped"] for r in two)
    step2 = checkpoints_dir(path) / "step_000002"
    resume = Checkpoint(step2, 2, json.loads((step2 / "state.json").read_text()))
    run_pipeline(cfg(1), RunDir.open(path), resume=resume)
    one = read_table(path / "metrics.parquet")
    assert [r["step"] for r in one] == [0, 1, 2]
    _assert_same_metrics(one[2], two[2])
