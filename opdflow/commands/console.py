"""What a person sees during and after a run: a progress bar and the closing summary.

Also where a run starts, resumes and ends for a person: a run that fails before its first
step leaves no directory behind; a stage failure or a requested stop ends with one clear
line (and, for a stop, how to resume), not a traceback.

The progress line is composed here, not by rich's fixed columns: in an 80-column terminal
rich cut every column short ("60…  0:0…"). `progress_line` keeps the step count, the
elapsed time and the held-out KL and drops the less useful parts first when the terminal
is narrow (the bar shrinks, then stale, wait, d_engine go, then the bar, then the label).
"""

from __future__ import annotations

import math
import shutil
import sys

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task
from rich.table import Table
from rich.text import Text

from opdflow.config import PipelineConfig
from opdflow.errors import ConfigError


def _fmt(x: float, spec: str = ".4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


BAR_MIN, BAR_MAX = 10, 40
"""Widths of the progress bar: it shrinks to BAR_MIN before any field is dropped."""


def _clock(seconds: float | None) -> str:
    s = int(seconds or 0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def progress_line(
    label: str, done: int, total: int | None, elapsed_s: float | None, fields: list[str], width: int
) -> Text:
    """One progress line of at most `width` cells: label, bar, done/total, elapsed, fields.

    `fields` come most useful first. When the line does not fit, the bar shrinks to
    BAR_MIN, then fields are dropped from the end, then the bar, then the label; the
    count, the time and the first field (held-out KL) are cut only below ~35 columns.
    """
    core = f"{done}/{total if total is not None else '?'} {_clock(elapsed_s)}"
    head = f"{label} " if label else ""
    for keep in range(len(fields), 0 if fields else -1, -1):
        tail = "".join(f"  {f}" for f in fields[:keep])
        room = width - len(head) - len(core) - len(tail) - 1  # 1: the space after the bar
        if room >= BAR_MIN:
            return _compose(head, min(room, BAR_MAX), done, total, core, tail)
    tail = "".join(f"  {f}" for f in fields[:1])
    for h in (head, ""):  # no bar, then no label either
        if len(h) + len(core) + len(tail) <= width:
            return _compose(h, 0, done, total, core, tail)
    return Text((core + tail)[:width], no_wrap=True)


def _compose(head: str, bar: int, done: int, total: int | None, core: str, tail: str) -> Text:
    text = Text(head, style="progress.description", no_wrap=True)
    if bar:
        filled = round(bar * done / total) if total else 0
        text.append("━" * filled, style="bar.complete")
        text.append("━" * (bar - filled) + " ", style="bar.back")
    text.append(core, style="progress.elapsed")
    text.append(tail)
    return text


class LineColumn(ProgressColumn):
    """The whole progress line as one column, fitted to the console's width each refresh."""

    def __init__(self, console: Console):
        super().__init__()
        self.console = console

    def render(self, task: Task) -> Text:
        return progress_line(
            task.description,
            int(task.completed),
            None if task.total is None else int(task.total),
            task.elapsed,
            task.fields.get("fields", []),
            self.console.width - 1,  # the last cell would wrap in some terminals
        )


def step_fields(row: dict, heldout_kl: float) -> list[str]:
    """Progress fields of a metrics row, most useful first (dropped from the end)."""
    return [
        f"held-out KL {_fmt(heldout_kl)}",
        f"d_engine {_fmt(row.get('d_engine_k1'), '.2e')}",
        f"wait {row.get('trainer_wait_s', float('nan')):.2f}s",
        f"stale {row.get('staleness', '?')}",
    ]


def make_progress(console: Console) -> Progress:
    """The live progress display of `opdflow run` (one task: the learner steps)."""
    return Progress(LineColumn(console), console=console)


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key} ({va!r} in the run, {vb!r} now)")
    return out


def open_resume(cfg: PipelineConfig, path: str):
    """The run directory and checkpoint to continue; the config must match the run's."""
    from opdflow.runtime.checkpoint import checkpoints_dir, load_latest
    from opdflow.runtime.rundir import RunDir

    run = RunDir.open(path)
    saved, now = run.config(), cfg.to_dict()
    for d in (saved, now):
        d.pop("run_dir", None)
        d["train"].pop("steps", None)
        d["resources"]["learner"].pop("workers", None)  # checkpoints reshard: any N resumes
    changed = _diff(saved, now)
    if changed:
        raise ConfigError(
            f"--resume {path}: the pipeline differs from the run's config.json in "
            + "; ".join(changed)
        )
    root = checkpoints_dir(run.path, cfg.reliability.checkpoint_dir)
    ckpt = load_latest(root)
    if ckpt is None:
        raise ConfigError(f"--resume {path}: no complete checkpoint in {root}; start a new run")
    return run, ckpt


def run_with_progress(
    cfg: PipelineConfig, run_dir: str | None = None, resume: str | None = None
) -> dict:
    """Run a pipeline with a live progress bar; print and return its summary."""
    from opdflow.driver.controller import run_pipeline
    from opdflow.runtime.rundir import RunDir
    from opdflow.runtime.supervisor import StageFailed, StopRequested
    from opdflow.runtime.trackers import check_trackers
    from opdflow.testbed.models import check_checkpoints

    check_checkpoints(cfg)  # bad input is refused before a run directory, a sink or Ray exists
    check_trackers(cfg)
    if cfg.engine.kind == "vllm":
        from opdflow.engines.vllm_version import check_vllm_version, installed_vllm

        check_vllm_version(installed_vllm())
    console = Console(stderr=True)
    if resume:
        run, ckpt = open_resume(cfg, resume)
    else:
        run, ckpt = RunDir.create(cfg, run_dir), None
    first = ckpt.step if ckpt else 0
    console.print(
        f"[bold]opdflow[/bold] {cfg.name}: recipe={cfg.engine.recipe} k={cfg.staleness.k} "
        f"({cfg.staleness.policy}) steps={cfg.train.steps}"
        + (f" resuming at step {first}" if ckpt else "")
        + f" -> {run.path}"
    )
    last_kl = {"v": float("nan")}
    try:
        with make_progress(console) as progress:
            task = progress.add_task(
                "starting stages", total=cfg.train.steps, completed=first, fields=[]
            )

            def on_step(row: dict) -> None:
                if not math.isnan(row.get("heldout_kl", float("nan"))):
                    last_kl["v"] = row["heldout_kl"]
                progress.update(
                    task, advance=1, description="training", fields=step_fields(row, last_kl["v"])
                )

            summary = run_pipeline(cfg, run, on_step, resume=ckpt)
    except StopRequested as exc:
        console.print(f"[yellow]{exc}[/yellow]")
        sys.exit(130)
    except StageFailed as exc:
        console.print(f"[red]error: {exc}[/red] (run directory: {run.path})")
        sys.exit(1)
    except BaseException:
        if ckpt is None and not run.metrics:  # nothing trained: leave nothing half-written
            shutil.rmtree(run.path, ignore_errors=True)
        raise
    print_summary(summary, console)
    return summary


def accuracy_change(s: dict) -> str:
    """'11.7% -> 30.9% (+19.2 points)', or why there is no accuracy."""
    a0, a1 = s.get("heldout_accuracy_start"), s.get("heldout_accuracy_end")
    if a0 is None or a1 is None:
        return "n/a (a run summary from before opdflow recorded it)"
    if math.isnan(a0) or math.isnan(a1):
        return "n/a (the held-out prompts have no reference answers)"
    return f"{a0:.1%} -> {a1:.1%} ({100 * (a1 - a0):+.1f} points)"


def restarts_line(s: dict) -> str:
    """'generator 2, teacher 1: cost 35% of updates/hour (RESTARTS SLOWED THIS RUN)', 'none',
    or n/a for a summary from before opdflow recorded restarts."""
    from opdflow.runtime.restarts import RESTART_FLAG_SHARE

    counts = s.get("restarts")
    if counts is None:
        return "n/a (a run summary from before opdflow recorded them)"
    if not counts:
        return "none"
    text = ", ".join(f"{stage} {n}" for stage, n in sorted(counts.items()))
    cost = s.get("restart_slowdown", 0.0)
    if cost is None or (isinstance(cost, float) and math.isnan(cost)):
        return text + ": every step was hit"
    flag = " (RESTARTS SLOWED THIS RUN)" if cost >= RESTART_FLAG_SHARE else ""
    return f"{text}: cost {cost:.0%} of updates/hour{flag}"


def print_summary(s: dict, console: Console | None = None) -> None:
    console = console or Console()
    t = Table(title="opdflow run summary", show_header=False)
    change = s["heldout_kl_change"]
    verdict = "lower: the student approached the teacher" if change < 0 else "NOT lower"
    t.add_row(
        "held-out KL (start -> end)",
        f"{_fmt(s['heldout_kl_start'])} -> {_fmt(s['heldout_kl_end'])} ({change:+.1%}, {verdict})",
    )
    t.add_row("held-out accuracy (start -> end)", accuracy_change(s))
    t.add_row("learner steps", str(s["steps"]))
    t.add_row("updates/hour (after warm-up)", _fmt(s["updates_per_hour"], ".0f"))
    t.add_row(
        "trainer wait (mean / share)",
        f"{s['trainer_wait_s_mean']:.3f} s / {s['trainer_wait_share']:.1%}",
    )
    t.add_row(
        "d_engine nats/token (k1 / k3 / exact)",
        f"{_fmt(s['d_engine_k1'], '.2e')} / {_fmt(s['d_engine_k3'], '.2e')} / {_fmt(s['d_engine_exact'], '.2e')}",
    )
    t.add_row(
        "d_stale nats/token (k1 / k3)",
        f"{_fmt(s['d_stale_k1'], '.2e')} / {_fmt(s['d_stale_k3'], '.2e')}",
    )
    t.add_row("max staleness / dropped batches", f"{s['max_staleness']} / {s['dropped_batches']}")
    t.add_row("stage restarts", restarts_line(s))
    t.add_row("run directory", s["run_dir"])
    console.print(t)
