"""`opdflow report`: plots and one self-contained HTML page for finished runs."""

from __future__ import annotations

import click


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Output directory (default RUN_DIR/report for one directory, ./opdflow-report for several).",
)
def report(run_dirs: tuple[str, ...], out: str | None) -> None:
    """Write PNG plots and report.html comparing RUN_DIRS (run or sweep directories)."""
    from opdflow.analysis.report import write_report

    page = write_report(list(run_dirs), out)
    click.echo(str(page))
