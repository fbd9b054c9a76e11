"""Long-run resource use: weight versions and batches are released; the object store stays flat."""

import re

import pytest
import ray
from ray._private.internal_api import memory_summary

from opdflow.config import PipelineConfig, apply_overrides
from opdflow.controller import run_pipeline
from opdflow.rundir import RunDir, read_table


def _plasma_objects() -> int:
    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    return int(re.search(r"Plasma memory usage \d+ MiB, (\d+) objects", text).group(1))


@pytest.mark.slow
def test_200_steps_keep_live_versions_and_object_store_bounded(tmp_path, ray_local, tiny):
    k = 2
    cfg = apply_overrides(
        PipelineConfig(name="long"),
        [
            f"staleness.k={k}",
            "train.steps=200",
            "eval.every=100",
            "eval.prompts=4",
            "data.prompts_per_step=2",
            "data.responses_per_prompt=2",
            "reliability.checkpoint_every=0",
        ],
    )
    objects = {}

    def on_step(row):
        if row["step"] % 25 == 24:
            objects[row["step"]] = _plasma_objects()

    run = RunDir.create(cfg, tmp_path / "run")
    run_pipeline(cfg, run, on_step=on_step)
    metrics = read_table(run.path / "metrics.parquet")
    assert len(metrics) == 200
    assert max(r["live_weight_versions"] for r in metrics) <= k + 2
    early, late = objects[49], max(v for s, v in objects.items() if s >= 99)
    assert late <= early + 2, objects  # flat: no growth with steps
