"""`opdflow study run` and `opdflow study render`: the paper's findings on the tiny models.

`run` trains every arm of the plan (study/runner.py: one driver Session, finished runs
reused and unfinished ones resumed, admission decided before any training, gradient
probes) and writes results.json.
`render` turns results.json into docs/STUDY.md with its tables and plots.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from opdflow.commands.options import set_option, tau_option


@click.group()
def study() -> None:
    """Reproduce the study's findings (docs/DESIGN.md, "The study") on the tiny models."""


@study.command("run")
@click.option("--quick", is_flag=True, help="The few short runs CI checks (a few minutes).")
@click.option(
    "--out",
    type=click.Path(),
    default=None,
    help="Study directory (runs/ and results.json); default runs/study-{full,quick}.",
)
@tau_option
@click.option(
    "--line",
    type=float,
    default=None,
    help="Admission line L fixed before training (default: the tiny models' calibrated L).",
)
@set_option
def run_study(
    quick: bool, out: str | None, tau: float, line: float | None, overrides: tuple[str, ...]
) -> None:
    """Train every arm, decide admission first, probe gradients; write results.json."""
    from rich.console import Console

    from opdflow.study.runner import run_study as run

    click.echo(str(run(quick, out, tau, line, overrides, Console(stderr=True))))


@study.command("render")
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--docs", type=click.Path(), default="docs", show_default=True)
def render_study(results: str, docs: str) -> None:
    """Write DOCS/STUDY.md and DOCS/study/*.png from a results.json."""
    from opdflow.study.doc import render
    from opdflow.study.results import StudyResults

    res = StudyResults.from_dict(json.loads(Path(results).read_text()))
    path = render(res, Path(docs), source=results)
    click.echo(str(path))
