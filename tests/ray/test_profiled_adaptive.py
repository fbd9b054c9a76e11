"""A short tiny run with the adaptive staleness policy: the bound holds, the profile is written."""

import json
import math

import pytest

from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.profiler import STAGES
from opdflow.record.rundir import RunDir, read_table

STEPS, K_MAX = 16, 2


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory, ray_local, tiny):
    cfg = apply_overrides(
        PipelineConfig(name="adaptive"),
        [
            "staleness.policy=adaptive",
            "staleness.k=0",
            f"staleness.k_max={K_MAX}",
            "staleness.budget_nats=0.5",
            f"train.steps={STEPS}",
            f"eval.every={STEPS}",
            "eval.prompts=8",
        ],
    )
    run = RunDir.create(cfg, tmp_path_factory.mktemp("adaptive") / "run")
    summary = run_pipeline(cfg, run)
    return summary, read_table(run.path / "metrics.parquet"), run


def _k_in_effect(run) -> list[int]:
    """k the controller applied to each step's batch: the start k, then each decision's new k."""
    events = [json.loads(x) for x in (run.path / "events.jsonl").read_text().splitlines()]
    decisions = [e for e in events if e["event"] == "staleness"]
    k, out = 0, []
    for step in range(STEPS):
        out.append(k)
        for d in decisions:
            if d["step"] == step:
                assert d["old_k"] == k and d["reason"]
                k = d["new_k"]
    return out


def test_every_step_trained_within_the_adaptive_bound(adaptive_run):
    summary, metrics, run = adaptive_run
    assert [r["step"] for r in metrics] == list(range(STEPS))
    ks = _k_in_effect(run)
    assert all(0 <= k <= K_MAX for k in ks)
    assert all(0 <= r["staleness"] <= k for r, k in zip(metrics, ks))
    assert all(r["k"] <= K_MAX for r in metrics)
    assert summary["max_staleness"] <= K_MAX


def test_the_run_trained_what_the_launch_rule_says(adaptive_run):
    # the controller drives core/launch.py's rule (the simulator drives the same one): a
    # fresh adaptive policy fed the run's observations makes the run's decisions and trains
    # each step at the run's version
    from opdflow.analysis.runs import Run
    from opdflow.core.launch import replay
    from opdflow.core.policy import make_policy

    run = Run(adaptive_run[2].path)
    trained = replay(make_policy(run.staleness), run.observations())
    assert [(t.step, t.version, t.k, t.dropped) for t in trained] == [
        (r["step"], r["version"], r["k"], r["dropped"]) for r in run.metrics
    ]


def test_spans_cover_every_stage_and_step(adaptive_run):
    _, _, run = adaptive_run
    spans = read_table(run.path / "spans.parquet")
    assert {s["stage"] for s in spans} == set(STAGES)
    assert sorted(s["step"] for s in spans if s["stage"] == "learner") == list(range(STEPS))
    gen_steps = {s["step"] for s in spans if s["stage"] == "generator"}
    assert gen_steps >= set(range(STEPS))
    assert all(s["end_s"] >= s["start_s"] for s in spans)
    publish = [s for s in spans if s["stage"] == "publish"]
    assert sorted(s["version"] for s in publish) == list(range(STEPS + 1))
    assert all(s["bytes"] > 0 for s in publish)
    assert all(s["bytes"] > 0 for s in spans if s["stage"] == "fetch")
    # a step's learner span lies inside that step's interval on the run clock: it starts
    # once the step before it has ended (the driver trains one step at a time, and the span
    # clock's origin is read before the step clock's) and lasts no longer than the step.
    # Starts are on the wall clock, step times on the monotonic one: the two tick at rates
    # within NTP's 500 ppm slew of each other, hence 1e-3 of the elapsed time of slack.
    _, metrics, _ = adaptive_run
    for s in spans:
        if s["stage"] == "learner":
            row = metrics[s["step"]]
            assert s["start_s"] >= row["time_s"] - row["step_s"] - 1e-3 * row["time_s"], (s, row)
            assert s["end_s"] - s["start_s"] <= row["step_s"], (s, row)


def test_trace_json_is_a_chrome_trace(adaptive_run):
    _, _, run = adaptive_run
    trace = json.loads((run.path / "trace.json").read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(read_table(run.path / "spans.parquet"))
    assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in complete)


def test_metrics_gain_busy_shares_queue_depth_and_fetches(adaptive_run):
    _, metrics, _ = adaptive_run
    for r in metrics:
        for kind in ("generator", "rescorer", "teacher", "learner"):
            share = r[f"busy_share_{kind}"]
            assert math.isfinite(share) and 0.0 <= share <= 1.0 + 1e-6
        assert 0 <= r["queue_depth"] <= K_MAX + 1
        assert r["fetch_s"] >= 0 and r["fetch_bytes"] >= 0
    assert sum(r["busy_share_learner"] for r in metrics) > 0
    assert sum(r["fetch_bytes"] for r in metrics) > 0
