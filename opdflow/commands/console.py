"""What a person sees during and after a run: a progress bar and the closing summary.

`opdflow run` trains through a driver Session (which creates, resumes and cleans up the
run directory); here it is shown: the header, the progress line, the summary table, and a
stage failure or a requested stop as one clear line (for a stop, how to resume), not a
traceback.

The progress line is composed here, not by rich's fixed columns: in an 80-column terminal
rich cut every column short ("60…  0:0…"). `progress_line` keeps the step count, the
elapsed time and the held-out KL and drops the less useful parts first when the terminal
is narrow (the bar shrinks, then stale, wait, d_engine go, then the bar, then the label).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, ProgressColumn, Task
from rich.table import Table
from rich.text import Text

from opdflow.analysis.curves import finite
from opdflow.analysis.figures import AFTER_WARMUP, ALL_STEPS, label, show
from opdflow.config import PipelineConfig
from opdflow.core.duration import duration

if TYPE_CHECKING:
    from opdflow.driver.session import Outcome


def fmt(x: float | None, spec: str = ".4f") -> str:
    """`x` formatted with `spec`; 'n/a' for None or NaN."""
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
        f"held-out KL {fmt(heldout_kl)}",
        f"d_engine {fmt(row.get('d_engine_k1'), '.2e')}",
        f"wait {row.get('trainer_wait_s', float('nan')):.2f}s",
        f"stale {row.get('staleness', '?')}",
    ]


class RunLines:
    """What a person sees of a batch of runs (a sweep, calibrate --short's ladder): a status
    line while each trains, then one line (a driver.session.Watch)."""

    def __init__(self, console: Console):
        self.console = console

    @contextlib.contextmanager
    def running(self, label: str, cfg: PipelineConfig) -> Iterator[Callable[[dict], None]]:
        steps, text = cfg.train.steps, escape(label)
        with self.console.status(f"{text}: {steps} steps") as status:
            yield lambda row: status.update(f"{text}: step {row['step'] + 1}/{steps}")

    def done(self, label: str, outcome: Outcome) -> None:
        path, steps = outcome.run.path, outcome.summary["steps"]
        if outcome.reused:
            line = f"{label}: reusing the finished run {path}"
        else:
            line = f"{label}: {steps} steps in {duration(outcome.seconds)} -> {path}"
        self.console.print(escape(line))


def make_progress(console: Console) -> Progress:
    """The live progress display of `opdflow run` (one task: the learner steps)."""
    return Progress(LineColumn(console), console=console)


def run_with_progress(
    cfg: PipelineConfig, run_dir: str | None = None, resume: str | None = None
) -> dict:
    """Run a pipeline in a driver Session with a live progress line; print and return its
    summary. A stop exits 130 and a stage failure 1, each with one line."""
    from opdflow.cluster.supervisor import StageFailed, StopRequested
    from opdflow.driver.session import Session

    console = Console(stderr=True)
    shown: dict = {"run": run_dir or resume, "kl": float("nan")}
    stack = contextlib.ExitStack()  # the progress line, from the header to the end

    def on_open(run, ckpt) -> None:  # the run directory exists: header, then the progress line
        first = ckpt.step if ckpt else 0
        console.print(
            f"[bold]opdflow[/bold] {cfg.name}: recipe={cfg.engine.recipe} k={cfg.staleness.k} "
            f"({cfg.staleness.policy}) steps={cfg.train.steps}"
            + (f" resuming at step {first}" if ckpt else "")
            + f" -> {run.path}"
        )
        progress = stack.enter_context(make_progress(console))
        task = progress.add_task(
            "starting stages", total=cfg.train.steps, completed=first, fields=[]
        )
        shown.update(run=run.path, progress=progress, task=task)

    def on_step(row: dict) -> None:
        if not math.isnan(row.get("heldout_kl", float("nan"))):
            shown["kl"] = row["heldout_kl"]
        shown["progress"].update(
            shown["task"], advance=1, description="training", fields=step_fields(row, shown["kl"])
        )

    try:
        with Session(log=lambda m: console.print(f"[dim]{m}[/dim]")) as session, stack:
            outcome = session.run(cfg, run_dir, resume=resume, on_open=on_open, on_step=on_step)
    except StopRequested as exc:
        console.print(f"[yellow]{escape(str(exc))}[/yellow]", soft_wrap=True)
        sys.exit(130)
    except StageFailed as exc:
        console.print(f"[red]error: {escape(str(exc))}[/red] (run directory: {shown['run']})",
                      soft_wrap=True)  # one line: a job's status shows it  # fmt: skip
        sys.exit(1)
    print_summary(outcome.summary, console)
    return outcome.summary


def accuracy_change(s: dict) -> str:
    """'11.7% -> 30.9% (+19.2 points)', or why there is no accuracy."""
    a0, a1 = s.get("heldout_accuracy_start"), s.get("heldout_accuracy_end")
    if a0 is None or a1 is None:
        return "n/a (a run summary from before opdflow recorded it)"
    if math.isnan(a0) or math.isnan(a1):
        return "n/a (the held-out prompts have no reference answers)"
    a0s, a1s = show("heldout_accuracy_start", a0), show("heldout_accuracy_end", a1)
    return f"{a0s} -> {a1s} ({100 * (a1 - a0):+.1f} points)"


def restarts_line(s: dict) -> str:
    """'generator 2, teacher 1: cost 35% of updates/hour (RESTARTS SLOWED THIS RUN)', 'none',
    or n/a for a summary from before opdflow recorded restarts."""
    from opdflow.cluster.restarts import RESTART_FLAG_SHARE

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
    return f"{text}: cost {show('restart_slowdown', cost)} of updates/hour{flag}"


def learner_losses_line(s: dict) -> str:
    """'rank 1 (node 10.0.0.2) lost at step 15, rewound to 10: 5 steps replayed, recovered in
    12.3 s, cost 310 updates/hour (8%)' per loss the learner healed from (the share: of the
    run's wall time); 'none'; or n/a."""
    losses = s.get("learner_losses")
    if losses is None:
        return "n/a (a run summary from before the learner healed)"
    return (
        "; ".join(
            f"rank{'s' if len(x['ranks']) > 1 else ''} {', '.join(map(str, x['ranks']))} "
            f"(node {', '.join(n['node'] for n in x['nodes'])}) lost at step {x['from_step']}, "
            f"rewound to {x['to_step']}: {x['replayed_steps']} steps replayed, recovered in "
            f"{x['recover_s']:.1f} s, cost {show('updates_per_hour_lost', x['updates_per_hour_lost'])}"
            " updates/hour"
            + (f" ({show('lost_share', x['lost_share'])})" if finite(x.get("lost_share")) else "")
            for x in losses
        )
        or "none"
    )


def node_losses_line(s: dict) -> str | None:
    """'198.18.0.13 (generator) at step 10: back after 14 s, 1 step replayed, 21% of
    updates/hour lost', one per loss joined by '; '; None for a run that lost no node."""
    losses = s.get("node_losses")
    if not losses:
        return None
    parts = []
    for x in losses:
        back = x["seconds_to_recover"]
        share = x.get("share_of_updates_per_hour")
        parts.append(
            f"{x['node']} ({', '.join(x['stages']) or 'nothing of this run'}) at step {x['step']}: "
            + (f"back after {back:.0f} s" if back is not None else "not restarted by Ray")
            + f", {x['steps_replayed']} step(s) replayed"
            + (
                f", {show('share_of_updates_per_hour', share)} of updates/hour lost"
                if finite(share)
                else ""
            )
        )
    return "; ".join(parts)


def print_summary(s: dict, console: Console | None = None) -> None:
    console = console or Console()
    t = Table(title="opdflow run summary", show_header=False)
    change = s["heldout_kl_change"]
    verdict = "lower: the student approached the teacher" if change < 0 else "NOT lower"

    def both(*keys: str) -> str:
        return " / ".join(show(k, s.get(k)) for k in keys)

    t.add_row(
        "held-out KL nats/token (start -> end)",
        f"{both('heldout_kl_start')} -> {both('heldout_kl_end')} ({change:+.1%}, {verdict})",
    )
    t.add_row("held-out accuracy (start -> end)", accuracy_change(s))
    t.add_row(label("steps"), both("steps"))
    t.add_row(label("updates_per_hour"), both("updates_per_hour"))
    t.add_row(f"trainer wait mean / share ({AFTER_WARMUP})",
              both("trainer_wait_s_mean", "trainer_wait_share"))  # fmt: skip
    t.add_row(f"d_engine k1 / k3 / exact ({ALL_STEPS})",
              both("d_engine_k1", "d_engine_k3", "d_engine_exact") + " nats/token")  # fmt: skip
    t.add_row(f"d_stale k1 / k3 ({ALL_STEPS})", both("d_stale_k1", "d_stale_k3") + " nats/token")
    t.add_row(f"max staleness ({ALL_STEPS}) / dropped batches",
              f"{both('max_staleness')} / {s['dropped_batches']}")  # fmt: skip
    t.add_row("stage restarts", restarts_line(s))
    t.add_row("learner losses healed", learner_losses_line(s))

    if (lost := node_losses_line(s)) is not None:
        t.add_row("node losses", lost)
    t.add_row("run directory", s["run_dir"])
    console.print(t)
