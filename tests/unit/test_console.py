"""What a person sees: the progress line in a narrow terminal and the run summary."""

from __future__ import annotations

import io
import math
import re

import pytest
from rich.console import Console

from opdflow.commands.console import make_progress, print_summary, progress_line, step_fields

ROW = {"d_engine_k1": 1.23e-8, "trainer_wait_s": 0.12, "staleness": 2}


def _rendered_progress(width: int, done: int = 12, elapsed_s: float = 45.0) -> list[str]:
    """The progress display of `opdflow run` after `done` steps, as a terminal of `width`
    columns shows it (rich renders it with the same console it draws on)."""
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    progress = make_progress(console)
    task = progress.add_task("starting stages", total=60, fields=[])
    progress.update(task, completed=done, description="training", fields=step_fields(ROW, 0.0729))
    progress.tasks[0].start_time = progress.get_time() - elapsed_s  # a run 45 s old
    console.print(progress.make_tasks_table(progress.tasks))
    return console.export_text().splitlines()


def test_an_80_column_terminal_shows_steps_time_and_heldout_kl_on_one_line():
    (line,) = _rendered_progress(80)
    assert len(line) <= 79
    assert "12/60" in line and "0:00:45" in line and "held-out KL 0.0729" in line
    assert "…" not in line  # nothing cut mid-field
    assert line.startswith("training ━")  # the bar is still there, shorter


def test_fields_are_dropped_least_useful_first():
    fields = step_fields(ROW, 0.0729)
    assert [f.split()[0] for f in fields] == ["held-out", "d_engine", "wait", "stale"]
    full = progress_line("training", 12, 60, 45, fields, 200).plain
    assert full.endswith("held-out KL 0.0729  d_engine 1.23e-08  wait 0.12s  stale 2")
    previous = len(fields)
    for width in range(160, 30, -1):
        line = progress_line("training", 12, 60, 45, fields, width).plain
        assert len(line) <= width
        kept = sum(f in line for f in fields)
        assert kept <= previous and fields[:kept] == [f for f in fields if f in line]
        previous = kept
        if width >= 34:  # count, time and held-out KL survive down to ~34 columns
            assert "12/60 0:00:45" in line and "held-out KL 0.0729" in line
    # the order of what goes: bar shrinks, stale, wait, d_engine, then bar, then label
    assert "stale 2" in progress_line("training", 12, 60, 45, fields, 93).plain
    assert "stale" not in progress_line("training", 12, 60, 45, fields, 92).plain
    assert "━" in progress_line("training", 12, 60, 45, fields, 60).plain
    assert progress_line("training", 12, 60, 45, fields, 45).plain == (
        "training 12/60 0:00:45  held-out KL 0.0729"
    )
    assert progress_line("training", 12, 60, 45, fields, 40).plain == (
        "12/60 0:00:45  held-out KL 0.0729"
    )


def test_summary_shows_heldout_accuracy_start_to_end():
    summary = {
        "heldout_kl_start": 0.334,
        "heldout_kl_end": 0.0848,
        "heldout_kl_change": -0.746,
        "heldout_accuracy_start": 0.117,
        "heldout_accuracy_end": 0.309,
        "steps": 60,
        "updates_per_hour": 11674.0,
        "trainer_wait_s_mean": 0.01,
        "trainer_wait_share": 0.023,
        "d_engine_k1": 1e-8,
        "d_engine_k3": 1e-9,
        "d_engine_exact": 1e-8,
        "d_stale_k1": 0.01,
        "d_stale_k3": 0.01,
        "max_staleness": 2,
        "dropped_batches": 0,
        "run_dir": "runs/x",
    }

    def shown(s: dict) -> str:
        console = Console(file=io.StringIO(), width=120, record=True, color_system=None)
        print_summary(s, console)
        return console.export_text()

    row = r"held-out accuracy \(start -> end\) +│ "
    assert re.search(row + r"11\.7% -> 30\.9% \(\+19\.2 points\)", shown(summary))
    no_answers = {**summary, "heldout_accuracy_start": math.nan, "heldout_accuracy_end": math.nan}
    assert "n/a (the held-out prompts have no reference answers)" in shown(no_answers)
    old = {k: v for k, v in summary.items() if not k.startswith("heldout_accuracy")}
    assert re.search(row + "n/a", shown(old))  # a summary from an older opdflow (a cluster's)


def test_summarize_reads_accuracy_from_heldout_rows_when_the_task_has_answers(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from opdflow.analysis.summary import summarize
    from opdflow.config import PipelineConfig
    from opdflow.config.overrides import apply_overrides
    from opdflow.record.rundir import RunDir

    def run_with(heldout: str, name: str) -> dict:
        cfg = apply_overrides(PipelineConfig(name=name), [f"data.heldout={heldout}"])
        run = RunDir.create(cfg, tmp_path / name)
        for step in range(2):
            run.add_metrics(
                {
                    "step": step,
                    "tokens": 10,
                    "trainer_wait_s": 0.1,
                    "step_s": 1.0,
                    "updates_per_hour": 3600.0,
                    "staleness": 0,
                    "live_weight_versions": 1,
                    **{
                        k: 0.0
                        for k in (
                            "d_engine_k1",
                            "d_engine_k3",
                            "d_engine_exact",
                            "d_stale_k1",
                            "d_stale_k3",
                            "d_total_k1",
                        )
                    },
                }
            )
        for version, accs in ((0, (0.0, 0.25)), (2, (0.5, 0.75))):
            run.add_heldout(
                [
                    {"version": version, "prompt_index": i, "kl_sum": 1.0, "tokens": 10, "kl": 0.1}
                    | {"accuracy": a}
                    for i, a in enumerate(accs)
                ]
            )
        return summarize(run, [], 0)

    s = run_with("tiny", "answers")
    assert s["heldout_accuracy_start"] == pytest.approx(0.125)
    assert s["heldout_accuracy_end"] == pytest.approx(0.625)
    prompts = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"prompt": ["Q:1+2="]}), prompts)
    s = run_with(str(prompts), "plain")
    assert math.isnan(s["heldout_accuracy_start"]) and math.isnan(s["heldout_accuracy_end"])
