"""Sweep tables: the knee rule, held-out KL at equal wall time, the plot, --k parsing."""

import math

import pytest

from opdflow.analysis.throughput import kl_at_time, kl_curve, knee, plot_sweep, sweep_rows
from opdflow.errors import ConfigError


def test_knee_is_the_smallest_k_within_five_percent_of_the_best():
    assert knee({0: 100.0, 1: 150.0, 2: 190.0, 4: 200.0, 8: 198.0}) == 2
    assert knee({0: 100.0, 1: 100.0}) == 0
    assert knee({0: 100.0, 1: 90.0, 2: float("nan")}) == 0
    assert knee({}) is None


def _metrics(step_s: float, steps: int, k: int, wait: float = 0.0) -> list[dict]:
    return [
        {"step": i, "time_s": (i + 1) * step_s, "step_s": step_s, "k": k, "trainer_wait_s": wait}
        for i in range(steps)
    ]


def _heldout(kls: dict[int, float]) -> list[dict]:
    return [{"version": v, "kl_sum": kl * 10, "tokens": 10} for v, kl in kls.items()]


def test_kl_curve_places_version_v_at_the_end_of_step_v_minus_1():
    curve = kl_curve(_metrics(2.0, 10, 0), _heldout({0: 2.0, 5: 1.5, 10: 1.0}))
    assert curve == [(0.0, 2.0), (10.0, 1.5), (20.0, 1.0)]
    assert kl_at_time(curve, 5.0) == pytest.approx(1.75)
    assert kl_at_time(curve, 20.0) == pytest.approx(1.0)
    assert math.isnan(kl_at_time(curve, 25.0))


def _run(label, policy, k, uph, step_s, kls):
    return {
        "label": label,
        "policy": policy,
        "summary_k": k,
        "summary": {
            "steps": 10,
            "updates_per_hour": uph,
            "trainer_wait_share": 0.1,
            "heldout_kl_start": kls[0],
            "heldout_kl_end": kls[10],
            "d_stale_k1": 0.001 * max(k, 0),
            "max_staleness": max(k, 0),
            "dropped_batches": 0,
            "run_dir": f"/tmp/{label}",
        },
        "metrics": _metrics(step_s, 10, max(k, 1)),
        "heldout": _heldout(kls),
    }


def test_sweep_rows_ratio_equal_time_kl_and_knee(tmp_path):
    runs = [
        _run("k=0", "fixed", 0, 100.0, 2.0, {0: 2.0, 10: 1.0}),
        _run("k=2", "fixed", 2, 196.0, 1.0, {0: 2.0, 10: 1.2}),
        _run("k=4", "fixed", 4, 200.0, 1.0, {0: 2.0, 10: 1.3}),
        _run("adaptive", "adaptive", -1, 199.0, 1.0, {0: 2.0, 10: 1.2}),
    ]
    rows = sweep_rows(runs)
    assert [r["ratio_to_k0"] for r in rows] == pytest.approx([1.0, 1.96, 2.0, 1.99])
    assert [r["knee"] for r in rows] == [False, True, False, False]
    # equal wall time = the shortest run (10 s): k=0 is half-way through its KL drop
    assert rows[0]["heldout_kl_equal_time"] == pytest.approx(1.5)
    assert rows[1]["heldout_kl_equal_time"] == pytest.approx(1.2)
    plot_sweep(rows, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 10_000


def test_parse_ks():
    from opdflow.commands.sweep import parse_ks

    assert parse_ks("0, 1,2,adaptive") == [0, 1, 2, "adaptive"]
    with pytest.raises(ConfigError, match="'x'"):
        parse_ks("0,x")
    with pytest.raises(ConfigError, match="empty"):
        parse_ks(",")
