"""One definition per figure: warm-up in or out as labelled, and the summary, the report and
the sweep table showing the same numbers in the same units for the same run."""

from __future__ import annotations

import json
import math

import pytest
from support.figures_shown import (
    SHOWN,
    number,
    report_shown,
    report_sweep_shown,
    summary_shown,
    sweep_table_shown,
)

from opdflow.analysis.faults import node_losses, restart_slowdown
from opdflow.analysis.figures import (
    FIGURES,
    UNITS,
    clock_start,
    figures_of,
    run_figures,
    show,
    timed_rows,
)
from opdflow.analysis.runs import Run

WARMUP = 2
WARM_WAIT_S, WAIT_S, STEP_S = 4.0, 0.1, 1.0


def _rows(steps: int = 8, k: int = 0) -> list[dict]:
    """Steps of 1 s whose trainer waited 0.1 s, but 4 s (of a 5 s step) during warm-up."""
    rows, t = [], 0.0
    for s in range(steps):
        warm = s < WARMUP
        step_s = STEP_S + (WARM_WAIT_S if warm else 0.0)
        t += step_s
        timed = s + 1 - WARMUP
        rows.append({
            "step": s, "version": max(0, s - k), "staleness": min(s, k), "k": k, "tokens": 100 + s,
            "trainer_wait_s": WARM_WAIT_S if warm else WAIT_S, "step_s": step_s, "time_s": t,
            "updates_per_hour": 3600 * timed / (t - 2 * (STEP_S + WARM_WAIT_S)) if timed > 0
            else math.nan,
            "live_weight_versions": 1, "weight_bytes_live": 0, "dropped": 0,
            **{key: 1e-3 * (s + 1) for key in ("d_engine_k1", "d_engine_k3", "d_engine_exact",
                                                "d_stale_k1", "d_stale_k3", "d_total_k1")},
        })  # fmt: skip
    return rows


def test_throughput_figures_leave_the_warm_up_out_and_the_others_count_every_step():
    rows = _rows()
    fig = run_figures(rows, [], {"warmup_steps": WARMUP})
    assert fig.trainer_wait_share == pytest.approx(WAIT_S / STEP_S)  # not (8 + 0.6) / 16
    assert fig.trainer_wait_s_mean == pytest.approx(WAIT_S)
    assert fig.updates_per_hour == rows[-1]["updates_per_hour"] == pytest.approx(3600 / STEP_S)
    everything = run_figures(rows, [], {"warmup_steps": 0})  # warm-up in: a different number
    assert everything.trainer_wait_share == pytest.approx((2 * 4.0 + 6 * 0.1) / 16)
    # mismatch and staleness count every step
    tokens = sum(r["tokens"] for r in rows)
    pooled = sum(r["tokens"] * r["d_stale_k1"] for r in rows) / tokens
    assert fig.d_stale_k1 == everything.d_stale_k1 == pytest.approx(pooled)
    assert fig.max_staleness == 0 and fig.k_final == 0 and fig.k_mean == 0
    for key in ("updates_per_hour", "trainer_wait_share", "trainer_wait_s_mean"):
        assert "after warm-up" in FIGURES[key].label
    for key in ("d_stale_k1", "max_staleness", "k_mean"):
        assert "all steps" in FIGURES[key].label


def test_a_resume_restarts_the_warm_up_and_a_short_run_is_timed_whole():
    rows = _rows(10)
    events = [{"event": "resume", "step": 3}, {"event": "rewind", "step": 6}]
    assert clock_start(events) == 3 and clock_start([]) == 0
    assert [r["step"] for r in timed_rows(rows, WARMUP, 3)] == list(range(5, 10))
    assert [r["step"] for r in timed_rows(rows, WARMUP)] == list(range(2, 10))
    assert timed_rows(rows[:2], WARMUP) == rows[:2]  # nothing follows the warm-up
    assert timed_rows([], WARMUP) == []


def test_fault_costs_leave_the_warm_up_out():
    rows = _rows()
    for r in rows:
        r["restarts"] = 0
    rows[4]["restarts"], rows[4]["step_s"], rows[5]["step_s"] = 1, 3.0, 3.0
    # after warm-up: clean steps 1 s, all steps (1 * 4 + 3 * 2) / 6
    assert restart_slowdown(rows, WARMUP) == pytest.approx(1 - 1 / (10 / 6))
    events = [{"event": "node_lost", "node": "n", "node_id": "n", "step": 4, "stages": [],
               "actors": [], "steps_replayed": []},
              {"event": "node_recovered", "node_id": "n", "step": 4, "seconds": 1.0}]  # fmt: skip
    (loss,) = node_losses(events, rows, WARMUP)
    assert loss["seconds_lost"] == pytest.approx(4.0)  # steps 4-5: 2 s each beyond the clean 1 s
    assert loss["updates_per_hour_lost"] == pytest.approx(3600 - 3600 * 6 / 10)


def test_each_unit_prints_one_way():
    assert show("trainer_wait_share", 0.0271) == "2.7%"
    assert show("heldout_accuracy_end", 0.25) == "25.0%"
    assert show("updates_per_hour", 11674.4) == "11674"
    assert show("trainer_wait_s_mean", 0.0114) == "0.011 s"
    assert show("heldout_kl_end", 0.33981) == "0.3398"
    assert show("d_stale_k1", 0.00012345) == "1.23e-04"
    assert show("max_staleness", 2) == "2"
    assert show("trainer_wait_share", math.nan) == show("updates_per_hour", None) == "n/a"
    assert show("not a figure", 0.123456) == "0.1235" and show("run", "k=0") == "k=0"
    assert {f.unit for f in FIGURES.values()} <= set(UNITS)
    assert number("2.7%") == pytest.approx(0.027) and number("0.011 s") == 0.011


def _write_run(root, k: int):
    """A finished run directory (through RunDir, as a run writes it) with its summary.json."""
    from opdflow.analysis.summary import summarize
    from opdflow.config import PipelineConfig
    from opdflow.config.overrides import apply_overrides
    from opdflow.record.rundir import RunDir

    cfg = apply_overrides(PipelineConfig(name=f"k{k}"), [f"staleness.k={k}",
                          f"warmup_steps={WARMUP}", "train.steps=8"])  # fmt: skip
    run = RunDir.create(cfg, root / f"k{k}")
    for row in _rows(8, k):
        run.add_metrics(row)
    for v, accs in ((0, (0.0, 0.25, 0.5, 0.25)), (8, (0.5, 0.75, 0.25, 1.0 - 0.25 * k))):
        run.add_heldout([
            {"version": v, "prompt_index": i, "kl_sum": 2.0 - 0.1 * v, "tokens": 10, "accuracy": a}
            for i, a in enumerate(accs)
        ])  # fmt: skip
    run.write_json("summary.json", summarize(run, [], 0))
    return run.path


def shown_everywhere(root, capsys, monkeypatch) -> dict[str, dict[str, dict[str, str]]]:
    """{place: {run (k=0, ...): {figure: printed text}}} for the runs of a sweep directory."""
    from opdflow.analysis.report import write_report
    from opdflow.analysis.runs import expand_run_dirs
    from opdflow.analysis.throughput import sweep_order, sweep_rows
    from opdflow.commands.sweep import print_table

    runs = sweep_order([Run(p) for p in expand_run_dirs([root])])
    names = {r.name: f"k={r.k}" if r.k_token != "adaptive" else "adaptive" for r in runs}
    page = write_report([root], root / "report").read_text()
    monkeypatch.setenv("COLUMNS", "400")
    capsys.readouterr()
    print_table(sweep_rows(runs))
    return {
        "summary": {names[r.name]: summary_shown(r.summary) for r in runs},
        "report": {names[n]: v for n, v in report_shown(page).items()},
        "report sweep table": report_sweep_shown(page),
        "sweep table": sweep_table_shown(capsys.readouterr().out),
    }


def test_summary_report_and_sweep_table_show_the_same_figures(tmp_path, capsys, monkeypatch):
    for k in (0, 1):
        _write_run(tmp_path, k)
    shown = shown_everywhere(tmp_path, capsys, monkeypatch)
    assert shown["summary"]["k=0"] == {
        "trainer_wait_share": "10.0%",  # after warm-up: not 53.8% (all steps)
        "updates_per_hour": "3600",
        "heldout_accuracy_end": "62.5%",
    }
    for place, runs in shown.items():
        assert runs == shown["summary"], place
    for k in (0, 1):  # and what they show is the run's figure
        fig = figures_of(Run(tmp_path / f"k{k}"))
        for key in SHOWN:
            assert number(shown["summary"][f"k={k}"][key]) == pytest.approx(
                getattr(fig, key), abs=0.5 if key == "updates_per_hour" else 5e-4
            )
    assert json.loads((tmp_path / "k1" / "summary.json").read_text())["k_final"] == 1
