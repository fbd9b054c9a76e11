"""A short pipeline run with the fp8 recipe reports a larger d_engine than bf16's."""

import math

from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.rundir import RunDir, read_table


def _mean_d_engine(tmp_path, recipe: str) -> float:
    cfg = apply_overrides(
        PipelineConfig(name=f"recipe-{recipe}"),
        [f"engine.recipe={recipe}", "train.steps=3", "eval.every=3", "staleness.k=0"],
    )
    run = RunDir.create(cfg, tmp_path / recipe)
    run_pipeline(cfg, run)
    rows = read_table(run.path / "metrics.parquet")
    assert len(rows) == 3 and all(math.isfinite(r["d_engine_exact"]) for r in rows)
    return sum(r["d_engine_exact"] for r in rows) / len(rows)


def test_fp8_run_reports_more_engine_mismatch_than_bf16(tmp_path, ray_local, tiny):
    bf16 = _mean_d_engine(tmp_path, "bf16")
    fp8 = _mean_d_engine(tmp_path, "fp8")
    assert 0 <= bf16 < 1e-3
    assert fp8 > 3 * bf16 and fp8 > 5e-4, (bf16, fp8)
