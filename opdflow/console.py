"""What a person sees during and after a run: a progress bar and the closing summary."""

from __future__ import annotations

import math

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from opdflow.config import PipelineConfig


def _fmt(x: float, spec: str = ".4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def run_with_progress(cfg: PipelineConfig, run_dir: str | None = None) -> dict:
    """Run a pipeline with a live progress bar; print and return its summary."""
    from opdflow.controller import run_pipeline
    from opdflow.rundir import RunDir

    console = Console(stderr=True)
    run = RunDir.create(cfg, run_dir)
    console.print(
        f"[bold]opdflow[/bold] {cfg.name}: recipe={cfg.engine.recipe} k={cfg.staleness.k} "
        f"({cfg.staleness.policy}) steps={cfg.train.steps} -> {run.path}"
    )
    last_kl = {"v": float("nan")}
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("starting stages", total=cfg.train.steps, info="")

        def on_step(row: dict) -> None:
            if not math.isnan(row.get("heldout_kl", float("nan"))):
                last_kl["v"] = row["heldout_kl"]
            progress.update(
                task,
                advance=1,
                description="training",
                info=f"held-out KL {_fmt(last_kl['v'])}  d_engine {_fmt(row['d_engine_k1'], '.2e')}  "
                f"wait {row['trainer_wait_s']:.2f}s  stale {row['staleness']}",
            )

        summary = run_pipeline(cfg, run, on_step)
    print_summary(summary, console)
    return summary


def print_summary(s: dict, console: Console | None = None) -> None:
    console = console or Console()
    t = Table(title="opdflow run summary", show_header=False)
    change = s["heldout_kl_change"]
    t.add_row(
        "held-out KL (start -> end)",
        f"{_fmt(s['heldout_kl_start'])} -> {_fmt(s['heldout_kl_end'])} "
        f"({change:+.1%} {'lower: the student approached the teacher' if change < 0 else 'NOT lower'})",
    )
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
    t.add_row("run directory", s["run_dir"])
    console.print(t)
