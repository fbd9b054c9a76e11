"""Short tiny runs on a real local Ray cluster: the dataflow, the bound, the numbers."""

import math

import pytest

from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.rundir import RunDir, read_table


def _run(tmp_path, k, steps, extra=()):
    cfg = apply_overrides(
        PipelineConfig(name=f"t{k}"),
        [f"staleness.k={k}", f"train.steps={steps}", f"eval.every={steps}", *extra],
    )
    run = RunDir.create(cfg, tmp_path / f"k{k}")
    summary = run_pipeline(cfg, run)
    return summary, read_table(run.path / "metrics.parquet"), run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ray_local, tiny, k0_run):
    return {0: k0_run, 2: _run(tmp_path_factory.mktemp("runs"), 2, steps=30)}


def test_training_lowers_the_heldout_kl_below_the_untrained_policys(runs):
    """Version 0's evaluation is the lr = 0 run's (train.lr = 0 is refused): the same
    held-out prompts, sampled with the same seed per prompt, by the weights lr = 0 would
    never change. The two runs (k = 0 and k = 2, one seed) evaluate version 0 alike, prompt
    for prompt, and after 30 steps at lr > 0 each ends below it."""
    start = {}
    for k, (summary, _, run) in runs.items():
        assert summary["heldout_version_start"] == 0 and summary["heldout_version_end"] == 30
        heldout = read_table(run.path / "heldout.parquet")
        start[k] = [r["kl"] for r in sorted(heldout, key=lambda r: r["prompt_index"])
                    if r["version"] == 0]  # fmt: skip
        assert summary["heldout_kl_end"] < summary["heldout_kl_start"], summary
    assert start[0] == pytest.approx(start[2], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("k", [0, 2])
def test_every_step_trained_once_within_the_staleness_bound(runs, k):
    summary, metrics, _ = runs[k]
    assert [r["step"] for r in metrics] == list(range(30))
    assert all(0 <= r["step"] - r["version"] <= k for r in metrics)
    assert [s for s, _ in summary["trained_steps_record"]] == list(range(30))
    assert [v for _, v in summary["trained_steps_record"]] == [r["version"] for r in metrics]
    if k == 0:
        assert all(r["staleness"] == 0 for r in metrics)
    else:  # asynchrony actually happened
        assert max(r["staleness"] for r in metrics) == k


@pytest.mark.parametrize("k", [0, 2])
def test_the_run_trained_what_the_launch_rule_says(runs, k):
    # the controller drives core/launch.py's rule (the simulator drives the same one): a
    # fresh policy fed the run's observations trains each step at the run's version
    from opdflow.analysis.runs import Run
    from opdflow.core.launch import replay
    from opdflow.core.policy import make_policy

    run = Run(runs[k][2].path)
    trained = replay(make_policy(run.staleness), run.observations())
    assert [(t.step, t.version, t.k, t.dropped) for t in trained] == [
        (r["step"], r["version"], r["k"], r["dropped"]) for r in run.metrics
    ]


@pytest.mark.parametrize("k", [0, 2])
def test_old_weight_versions_are_released(runs, k, tiny):
    from opdflow.inputs.models import load_model
    from opdflow.weights.version import pack

    summary, metrics, _ = runs[k]
    assert max(r["live_weight_versions"] for r in metrics) <= k + 2
    # bytes per live version: Ray's object size of one packed version (its buffer plus a
    # pickled manifest of a few KB), never more, never a version counted without its bytes
    state = load_model(str(tiny.student), "float32").state_dict()
    version_bytes = pack({k: v.bfloat16() for k, v in state.items()}, 0).nbytes  # as published
    for r in metrics:
        n = r["live_weight_versions"]
        assert n * version_bytes <= r["weight_bytes_live"] <= n * (version_bytes + 2**16), r
    assert summary["weight_bytes_live_max"] == max(r["weight_bytes_live"] for r in metrics)
    assert summary["live_weight_versions_max"] <= k + 2


def test_rescorer_reproduces_the_learner_up_to_bf16_rounding(runs):
    # k = 0: the rescorer (BF16 at version v) and the learner (FP32 master at step n = v)
    # score the same tokens with the same weights; they differ only by bf16 rounding.
    _, metrics, _ = runs[0]
    for r in metrics:
        assert abs(r["d_stale_k1"]) < 0.02
        assert 0 <= r["d_stale_k3"] < 0.01
    # d_engine of the standard bf16 engine is small and reported, exact included
    assert all(
        math.isfinite(r["d_engine_exact"]) and 0 <= r["d_engine_exact"] < 1e-3 for r in metrics
    )


def test_run_directory_contents(runs):
    summary, metrics, run = runs[2]
    for name in ("config.json", "metrics.parquet", "heldout.parquet", "summary.json"):
        assert (run.path / name).is_file()
    heldout = read_table(run.path / "heldout.parquet")
    assert {r["version"] for r in heldout} == {0, 30}
    assert len(heldout) == 2 * 64
    # every evaluation is on a metrics row (so in every tracker): version v on row v - 1
    on_rows = {r["heldout_version"]: r["step"] for r in metrics if r["heldout_version"] >= 0}
    assert on_rows == {0: 0, 30: 29}
    assert all(math.isfinite(metrics[s]["heldout_kl"]) for s in on_rows.values())
    row = metrics[-1]
    for key in (
        "trainer_wait_s",
        "step_s",
        "updates_per_hour",
        "tokens_per_s",
        "d_engine_k1",
        "d_engine_k3",
        "d_stale_k1",
        "d_stale_k3",
        "d_total_k1",
        "train_kl",
        "heldout_kl",
    ):
        assert key in row
    assert summary["updates_per_hour"] > 0


def test_one_name_per_actor_in_spans_events_and_placement(runs):
    # core/actor_name.py: the profiler's spans, the placement event (the node watch) and the
    # stages' table name each actor alike (a generator is generator[i] in all of them)
    _, _, run = runs[2]
    spans = {r["actor"] for r in read_table(run.path / "spans.parquet")}
    placed = next(e for e in run.events() if e["event"] == "placement")["actors"]
    assert spans == set(placed) == {"generator[0]", "rescorer", "teacher", "learner", "evaluator"}
