"""Sweep tables: the knee rule, held-out KL at equal wall time, the plot, --k parsing."""

import math

import pytest

from opdflow.analysis.curves import kl_at_time, kl_curve
from opdflow.analysis.runs import Run
from opdflow.analysis.throughput import knee, plot_sweep, sweep_rows
from opdflow.config import PipelineConfig
from opdflow.core.policy import parse_ks, settings_for
from opdflow.errors import ConfigError
from opdflow.record.rundir import RunDir


def test_knee_is_the_smallest_k_within_five_percent_of_the_best():
    assert knee({0: 100.0, 1: 150.0, 2: 190.0, 4: 200.0, 8: 198.0}) == 2
    assert knee({0: 100.0, 1: 100.0}) == 0
    assert knee({0: 100.0, 1: 90.0, 2: float("nan")}) == 0
    assert knee({}) is None


def _metrics(step_s: float, steps: int, k: int, wait: float = 0.0, uph: float = 0.0) -> list:
    return [
        {"step": i, "time_s": (i + 1) * step_s, "step_s": step_s, "k": k, "trainer_wait_s": wait,
         "updates_per_hour": uph, "staleness": min(i, k), "tokens": 10, "d_stale_k1": 0.001 * k}
        for i in range(steps)
    ]  # fmt: skip


def _heldout(kls: dict[int, float]) -> list[dict]:
    return [{"version": v, "kl_sum": kl * 10, "tokens": 10} for v, kl in kls.items()]


def test_kl_curve_places_version_v_at_the_end_of_step_v_minus_1():
    curve = kl_curve(_metrics(2.0, 10, 0), _heldout({0: 2.0, 5: 1.5, 10: 1.0}))
    assert curve == [(0.0, 2.0), (10.0, 1.5), (20.0, 1.0)]
    assert kl_at_time(curve, 5.0) == pytest.approx(1.75)
    assert kl_at_time(curve, 20.0) == pytest.approx(1.0)
    assert math.isnan(kl_at_time(curve, 25.0))


def _run(root, token, uph, step_s, kls) -> Run:
    """A finished run directory (written through RunDir) at one sweep token."""
    cfg = PipelineConfig(name=str(token), warmup_steps=0)
    cfg.staleness = settings_for(token, cfg.staleness, k_max=4)
    run = RunDir.create(cfg, root / str(token))
    for row in _metrics(step_s, 10, cfg.staleness.k or 1, uph=uph):
        run.add_metrics(row)
    run.add_heldout(_heldout(kls))
    return Run(run.path)


def test_sweep_rows_ratio_equal_time_kl_and_knee(tmp_path):
    runs = [
        _run(tmp_path, 0, 100.0, 2.0, {0: 2.0, 10: 1.0}),
        _run(tmp_path, 2, 196.0, 1.0, {0: 2.0, 10: 1.2}),
        _run(tmp_path, 4, 200.0, 1.0, {0: 2.0, 10: 1.3}),
        _run(tmp_path, "adaptive", 199.0, 1.0, {0: 2.0, 10: 1.2}),
    ]
    rows = sweep_rows(runs)
    assert [r["run"] for r in rows] == ["k=0", "k=2", "k=4", "adaptive"]
    assert [(r["policy"], r["k"]) for r in rows][-1] == ("adaptive", -1)
    assert [r["ratio_to_k0"] for r in rows] == pytest.approx([1.0, 1.96, 2.0, 1.99])
    assert [r["knee"] for r in rows] == [False, True, False, False]
    # equal wall time = the shortest run (10 s): k=0 is half-way through its KL drop
    assert rows[0]["heldout_kl_equal_time"] == pytest.approx(1.5)
    assert rows[1]["heldout_kl_equal_time"] == pytest.approx(1.2)
    plot_sweep(rows, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 10_000


def test_parse_ks():
    assert parse_ks("0, 1,2,adaptive") == [0, 1, 2, "adaptive"]
    with pytest.raises(ConfigError, match="'x'"):
        parse_ks("0,x")
    with pytest.raises(ConfigError, match="empty"):
        parse_ks(",")
