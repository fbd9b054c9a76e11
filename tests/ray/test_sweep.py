"""`opdflow sweep` end to end on the tiny pipeline: one run per k, a table and a plot, and
the same figures in each run's summary, the report and the sweep table."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.figures_shown import (
    SHOWN,
    report_shown,
    report_sweep_shown,
    summary_shown,
    sweep_table_shown,
)

from opdflow.cli import main
from opdflow.record.rundir import read_table

TINY = str(Path(__file__).resolve().parents[2] / "pipelines" / "tiny_cpu.py:short_answers")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, ray_local, tiny):
    """A 4-step sweep over k = 0, 1 and the adaptive policy (warm-up: 1 step): its directory
    and what `opdflow sweep` printed (wide enough that rich cuts no cell)."""
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    args = ["sweep", TINY, "--k", "0,1,adaptive", "--steps", "4", "--out", str(out)]
    args += ["--set", "eval.every=2", "--set", "eval.prompts=8", "--set", "warmup_steps=1"]
    result = CliRunner().invoke(main, args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return out, result.output


def test_sweep_writes_a_row_per_k_and_the_plot(sweep):
    out, output = sweep
    rows = read_table(out / "sweep.parquet")
    assert [r["run"] for r in rows] == ["k=0", "k=1", "adaptive"]
    assert rows[0]["ratio_to_k0"] == 1.0
    assert sum(r["knee"] for r in rows) == 1
    assert all(r["steps"] == 4 and r["max_staleness"] <= 1 for r in rows)
    assert (out / "sweep.png").stat().st_size > 10_000
    assert (out / "k1" / "trace.json").is_file()
    assert "knee" in output


def test_summary_report_and_sweep_table_show_the_same_figures(sweep, tmp_path):
    # one definition per figure: trainer wait share (after warm-up), updates/hour and
    # held-out accuracy read the same, in the same units, wherever a run is shown
    from opdflow.analysis.report import write_report

    out, output = sweep
    rows = read_table(out / "sweep.parquet")
    dirs = {r["run"]: Path(r["run_dir"]) for r in rows}
    summaries = {k: json.loads((d / "summary.json").read_text()) for k, d in dirs.items()}
    for k, row in zip(dirs, rows):  # the numbers themselves
        assert {key: summaries[k][key] for key in SHOWN} == {key: row[key] for key in SHOWN}
    page = write_report([out], tmp_path / "report").read_text()
    shown = {
        "summary": {k: summary_shown(s) for k, s in summaries.items()},
        "report": {k: report_shown(page)[d.name] for k, d in dirs.items()},
        "report sweep table": report_sweep_shown(page),
        "sweep table": sweep_table_shown(output),
    }
    assert set(shown["sweep table"]) == set(dirs)
    for place, runs in shown.items():
        assert runs == shown["summary"], place
    for k, s in summaries.items():  # the share of the steps after the 1-step warm-up
        timed = read_table(dirs[k] / "metrics.parquet")[1:]
        wait = sum(r["trainer_wait_s"] for r in timed) / sum(r["step_s"] for r in timed)
        assert s["trainer_wait_share"] == pytest.approx(wait)
        assert all(shown["summary"][k][key] != "n/a" for key in SHOWN)
