"""What a person sees during and after a run: a progress bar and the closing summary.

Also where a run starts, resumes and ends for a person: a run that fails before its first
step leaves no directory behind; a stage failure or a requested stop ends with one clear
line (and, for a stop, how to resume), not a traceback.
"""

from __future__ import annotations

import math
import shutil
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from opdflow.config import ConfigError, PipelineConfig


def _fmt(x: float, spec: str = ".4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


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
    from opdflow.checkpoint import checkpoints_dir, load_latest
    from opdflow.rundir import RunDir

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
    from opdflow.controller import run_pipeline
    from opdflow.models import check_checkpoints
    from opdflow.rundir import RunDir
    from opdflow.supervisor import StageFailed, StopRequested
    from opdflow.trackers import check_trackers

    check_checkpoints(cfg)  # bad input is refused before a run directory, a sink or Ray exists
    check_trackers(cfg)
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
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
        ) as progress:
            task = progress.add_task(
                "starting stages", total=cfg.train.steps, completed=first, info=""
            )

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


def print_summary(s: dict, console: Console | None = None) -> None:
    console = console or Console()
    t = Table(title="opdflow run summary", show_header=False)
    change = s["heldout_kl_change"]
    verdict = "lower: the student approached the teacher" if change < 0 else "NOT lower"
    t.add_row(
        "held-out KL (start -> end)",
        f"{_fmt(s['heldout_kl_start'])} -> {_fmt(s['heldout_kl_end'])} ({change:+.1%}, {verdict})",
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
