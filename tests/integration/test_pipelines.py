"""Every shipped pipeline file: each function loads and validates, and runs tiny.

Pipelines that ask for GPUs (pipelines/dapo_math.py: vLLM, local 7B checkpoints) run only
under the gpu marker, with their checkpoints and data in place."""

import dataclasses
from pathlib import Path

import pytest

from opdflow.config import load_pipeline, pipeline_functions

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


@pytest.fixture(scope="module")
def cluster():
    """One embedded cluster for every pipeline (as `opdflow run` starts), stopped after."""
    import ray

    from opdflow.raycluster import connect

    connect()
    yield
    ray.shutdown()


@pytest.mark.parametrize("spec", RUNNABLE, ids=lambda s: Path(s).name)
def test_pipeline_runs_tiny(spec, tmp_path, tiny, cluster):
    from opdflow.controller import run_pipeline
    from opdflow.rundir import RunDir, read_table

    overrides = ["train.steps=3", "eval.every=3", "eval.prompts=8"]
    if load_pipeline(spec).models.tiny.student == "carry_blind":
        # a carry-blind build needs no accuracy threshold: a short one runs the same code
        overrides += ["models.tiny.teacher_steps=40", "models.tiny.carry_blind_steps=5"]
    cfg = load_pipeline(spec, overrides)
    run = RunDir.create(cfg, tmp_path / "run")
    summary = run_pipeline(cfg, run)
    assert summary["steps"] == 3
    assert len(read_table(run.path / "metrics.parquet")) == 3
