"""resources.placement: stages reserved together as Ray placement groups, on a real cluster."""

import pytest
import ray
from ray.util import placement_group_table

from opdflow.cluster.supervisor import StageFailed
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.rundir import RunDir


def _cfg(*extra: str) -> PipelineConfig:
    return apply_overrides(
        PipelineConfig(name="placed"),
        ["train.steps=3", "eval.every=3", "eval.prompts=4", "staleness.k=1", *extra],
    )


def test_grouped_stages_share_a_placement_group_that_is_removed_after(tmp_path, ray_local, tiny):
    cfg = _cfg(
        'resources.placement.groups=[["learner","rescorer","teacher"],["generator","evaluator"]]',
        "resources.placement.strategy=STRICT_PACK",
    )
    seen = {}

    def on_start(st):
        for name, actor in st.actors().items():
            seen[name] = ray.get(actor.placement_group_id.remote())

    summary = run_pipeline(cfg, RunDir.create(cfg, tmp_path / "run"), on_start=on_start)
    assert summary["steps"] == 3
    assert seen["learner"] and seen["learner"] == seen["rescorer"] == seen["teacher"]
    assert seen["generator[0]"] and seen["generator[0]"] == seen["evaluator"]
    assert seen["learner"] != seen["evaluator"]
    table = placement_group_table()
    for pg in {seen["learner"], seen["evaluator"]}:
        assert table[pg]["state"] == "REMOVED", table[pg]
        assert table[pg]["strategy"] == "STRICT_PACK"
    # learner (1 CPU), rescorer and teacher (no CPU: the light bundle) in one group
    bundles = sorted(table[seen["learner"]]["bundles"].values(), key=lambda b: -b["CPU"])
    assert bundles == [{"CPU": 1.0}, {"CPU": 0.01}, {"CPU": 0.01}]


def test_a_group_the_cluster_cannot_hold_is_an_error_not_a_hang(tmp_path, ray_local, tiny):
    cfg = _cfg(
        'resources.placement.groups=[["learner","rescorer"]]',
        "resources.placement.strategy=STRICT_SPREAD",  # two nodes needed; the cluster has one
        "reliability.startup_timeout_s=3",
    )
    with pytest.raises(StageFailed, match=r"learner\+rescorer \(STRICT_SPREAD\)"):
        run_pipeline(cfg, RunDir.create(cfg, tmp_path / "run"))
    # nothing is left reserved
    assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())
