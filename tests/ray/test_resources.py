"""Long-run resource use: weight versions and batches are released; the object store stays flat."""

import re

import pytest
import ray
from ray._private.internal_api import memory_summary

from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.rundir import RunDir, read_table


def _referenced_bytes() -> float:
    """Bytes of the objects something still references (Ray frees unreferenced ones in
    batches, so the plasma object count is a sawtooth even without a leak)."""
    text = memory_summary(address=ray.get_runtime_context().gcs_address, num_entries=1)
    return float(re.search(r"Mem Used by Objects.*\n\s*([\d.]+) B", text).group(1))


@pytest.mark.slow
def test_200_steps_keep_live_versions_and_object_store_bounded(tmp_path, ray_local, tiny):
    from opdflow.inputs.models import load_model
    from opdflow.weights.version import pack

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
    referenced = {}

    def on_step(row):
        if row["step"] % 25 == 24:
            referenced[row["step"]] = (_referenced_bytes(), row["weight_bytes_live"])

    run = RunDir.create(cfg, tmp_path / "run")
    run_pipeline(cfg, run, on_step=on_step)
    metrics = read_table(run.path / "metrics.parquet")
    assert len(metrics) == 200
    assert max(r["live_weight_versions"] for r in metrics) <= k + 2
    version_bytes = pack(load_model(str(tiny.student), "bfloat16").state_dict(), 0).nbytes
    # at most the live versions, one more borrowed by a queued generation task and one by
    # the evaluator (a sample at step 99 meets the held-out evaluation of version 100), and
    # small batches: flat. A leak of one version per step would be ~200 versions by the end.
    assert max(used for used, _ in referenced.values()) <= (k + 4) * version_bytes + 1e6, referenced
    # what the store accounts for is what Ray holds: its live versions, plus at most the two
    # borrowed ones and small batches
    for used, live in referenced.values():
        assert live <= (k + 2) * (version_bytes + 2**16)
        assert used <= live + 2 * version_bytes + 1e6, referenced


def test_collective_keeps_k_plus_2_versions_and_the_learner_holds_only_what_is_needed(
    tmp_path, ray_local, tiny
):
    """weights.transport=collective (gloo): the object store holds only handles, the learner
    holds the bytes. At every step it holds the live versions (at most k + 2), a version a
    pending evaluation has yet to load and one whose send is in flight, nothing else; the
    run's weight_bytes_live is what it holds. A leak would show within these steps."""
    k, steps = 2, 40
    cfg = apply_overrides(
        PipelineConfig(name="long"),
        [f"staleness.k={k}", f"train.steps={steps}", "eval.every=20", "eval.prompts=4",
         "data.prompts_per_step=2", "data.responses_per_prompt=2",
         "reliability.checkpoint_every=0", "weights.transport=collective"],
    )  # fmt: skip
    stages, seen = {}, []

    def on_step(row):
        st = stages["st"]
        held, needed = ray.get(st.learner.held.remote()), set(st.learner_held["needed"])
        seen.append((row, held, set(st.store.live_versions()), needed))

    run = RunDir.create(cfg, tmp_path / "run")
    run_pipeline(cfg, run, on_step=on_step, on_start=lambda st: stages.update(st=st))
    metrics = read_table(run.path / "metrics.parquet")
    assert len(metrics) == steps
    assert max(r["live_weight_versions"] for r in metrics) <= k + 2
    version_bytes = max(h["bytes"] // max(len(h["versions"]), 1) for _, h, _, _ in seen)
    for row, held, live, needed in seen:
        assert len(live) <= k + 2
        # needed: the live versions and those pending evaluations will load, as of the last
        # release; a version published since is newer than all of them
        newer = {v for v in held["versions"] if v > max(needed)}
        extra = set(held["versions"]) - needed - newer - set(held["sending"])
        assert not extra, (row["step"], held, live, needed)
        assert len(needed - live) <= 1  # at most one evaluation pending past its version
        assert row["weight_bytes_live"] <= (k + 3) * version_bytes, row
