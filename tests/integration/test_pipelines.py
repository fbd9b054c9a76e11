"""Every shipped pipeline file: each function loads and validates, and runs tiny.

Pipelines that ask for GPUs (pipelines/dapo_math.py: vLLM, local 7B checkpoints) run only
under the gpu marker, with their checkpoints and data in place."""

import dataclasses
import math
from pathlib import Path

import pytest

from opdflow.config.loader import load_pipeline, pipeline_functions

PIPELINES = sorted(Path(__file__).resolve().parents[2].joinpath("pipelines").glob("*.py"))
SPECS = [f"{p}:{name}" for p in PIPELINES for name in pipeline_functions(p)]


def _needs_gpu(spec: str) -> bool:
    r = load_pipeline(spec).resources
    return any(
        getattr(r, f.name).num_gpus > 0 for f in dataclasses.fields(r) if f.name != "placement"
    )


RUNNABLE = [pytest.param(s, marks=pytest.mark.gpu) if _needs_gpu(s) else s for s in SPECS]


def test_pipelines_exist():
    assert PIPELINES, "no pipeline files found"
    assert any(s.endswith("tiny_cpu.py:pipeline") for s in SPECS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: Path(s).name)
def test_pipeline_loads_and_validates(spec):
    cfg = load_pipeline(spec)
    assert cfg.train.steps > 0


def assert_run_shows(cfg, summary: dict, path: Path) -> None:
    """What every finished run shows, whatever its pipeline, engine or size: each step
    trained once, on a batch within the staleness bound; finite loss and mismatch; no more
    live weight versions than the policy's bound; exact held-out KL (never negative) on the
    same prompts at version 0 and at the end. Not that KL falls: three steps of a
    pipeline's own learning rate need not move it."""
    from opdflow.core.policy import make_policy
    from opdflow.record.rundir import read_table

    steps, policy = cfg.train.steps, make_policy(cfg.staleness)
    rows = read_table(path / "metrics.parquet")
    assert [r["step"] for r in rows] == list(range(steps)) and summary["steps"] == steps
    assert [tuple(x) for x in summary["trained_steps_record"]] == [
        (r["step"], r["version"]) for r in rows
    ]
    for r in rows:
        assert 0 <= r["staleness"] == r["step"] - r["version"] <= policy.k_max, r
        assert not r["skipped"] and math.isfinite(r["loss"]), r
        assert all(math.isfinite(r[d]) for d in ("d_engine_k1", "d_stale_k1", "d_total_k1")), r
        assert 1 <= r["live_weight_versions"] <= policy.live_versions, r
    held = read_table(path / "heldout.parquet")
    by_version: dict[int, set[int]] = {}
    for h in held:
        by_version.setdefault(h["version"], set()).add(h["prompt_index"])
        assert math.isfinite(h["kl"]) and h["kl"] >= 0 and h["tokens"] > 0, h
    assert set(by_version) == {0, steps} and by_version[0] == by_version[steps], by_version
    assert summary["heldout_kl_start"] >= 0 and summary["heldout_kl_end"] >= 0, summary


@pytest.fixture(scope="module")
def cluster():
    """One embedded cluster for every pipeline (as `opdflow run` starts), stopped after."""
    import ray

    from opdflow.cluster.connection import connect

    connect()
    yield
    ray.shutdown()


@pytest.mark.parametrize("spec", RUNNABLE, ids=lambda s: Path(s).name)
def test_pipeline_runs_tiny(spec, tmp_path, tiny, cluster):
    from opdflow.driver.controller import run_pipeline
    from opdflow.record.rundir import RunDir

    overrides = ["train.steps=3", "eval.every=3", "eval.prompts=8"]
    if load_pipeline(spec).models.tiny.student == "carry_blind":
        # a carry-blind build needs no accuracy threshold: a short one runs the same code
        overrides += ["models.tiny.teacher_steps=40", "models.tiny.carry_blind_steps=5"]
    cfg = load_pipeline(spec, overrides)
    run = RunDir.create(cfg, tmp_path / "run")
    summary = run_pipeline(cfg, run)
    assert_run_shows(cfg, summary, run.path)


def _local_checkpoint(tiny, part: str, out) -> str:
    """A tiny model saved as a user's local checkpoint: weights, config and tokenizer."""
    import shutil

    shutil.copytree(getattr(tiny, part), out)
    shutil.copytree(tiny.tokenizer, out, dirs_exist_ok=True)
    return str(out)


def test_the_gpu_pipeline_runs_its_code_path_on_cpu(tiny, tmp_path, cluster):
    """pipelines/dapo_math.py:student_1p5b for 3 steps with tiny local checkpoints and data,
    no GPU: 2 FSDP2 learner ranks over gloo, micro-batches, held-out prompts in batches, and a
    sharded checkpoint that a one-worker learner resumes (as the GPU run would, CUDA aside)."""
    import json

    from opdflow.driver.controller import run_pipeline
    from opdflow.record.checkpoint import Checkpoint, checkpoints_dir
    from opdflow.record.rundir import RunDir, read_table

    cpu = "num_gpus=0", "num_cpus=0.25", "torch_threads=1"
    overrides = [
        f"models.student={_local_checkpoint(tiny, 'student', tmp_path / 'student')}",
        f"models.teacher={_local_checkpoint(tiny, 'teacher', tmp_path / 'teacher')}",
        f"data.train={tiny.train}",
        f"data.heldout={tiny.heldout}",
        "data.prompts_per_step=3",
        "data.max_prompt_tokens=16",
        "engine.kind=torch",
        "engine.replicas=1",
        "engine.max_new_tokens=8",
        "train.steps=3",
        "train.micro_batch_tokens=48",  # ~2 responses a micro-batch: several per rank
        "eval.prompts=8",
        "eval.every=3",
        "eval.batch_prompts=3",
        "reliability.checkpoint_every=2",
        "reliability.stage_timeout_s=600",
        *(f"resources.{stage}.{kv}" for stage in
          ("generator", "learner", "rescorer", "teacher", "evaluator") for kv in cpu),
    ]  # fmt: skip
    spec = f"{PIPELINES[0].parent / 'dapo_math.py'}:student_1p5b"
    cfg = load_pipeline(spec, overrides)
    assert cfg.resources.learner.workers == 2 and cfg.train.activation_checkpointing
    run = RunDir.create(cfg, tmp_path / "run")
    summary = run_pipeline(cfg, run)
    assert_run_shows(cfg, summary, run.path)
    rows = read_table(run.path / "metrics.parquet")
    assert all(r["micro_batches"] >= 2 * cfg.resources.learner.workers for r in rows)
    assert all(r["learner_peak_mem_gb"] > 0 and not r["skipped"] for r in rows)
    assert len(read_table(run.path / "heldout.parquet")) == 2 * cfg.eval.prompts  # v0, v3
    step2 = checkpoints_dir(run.path) / "step_000002"
    shards = sorted(p.name for p in step2.glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shards
    one = load_pipeline(spec, [*overrides, "resources.learner.workers=1"])
    resume = Checkpoint(step2, 2, json.loads((step2 / "state.json").read_text()))
    run_pipeline(one, RunDir.open(run.path), resume=resume)
    again = read_table(run.path / "metrics.parquet")
    assert again[2]["loss"] == pytest.approx(rows[2]["loss"], rel=1e-5, abs=1e-6)
