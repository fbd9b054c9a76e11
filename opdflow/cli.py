"""The `opdflow` command line. Heavy modules are imported inside commands: --help is instant."""

from __future__ import annotations

import sys

import click

from opdflow import __version__


class _Group(click.Group):
    """Turns ConfigError into a one-line message and exit code 2, no traceback."""

    def invoke(self, ctx: click.Context):
        from opdflow.config import ConfigError

        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="opdflow")
def main() -> None:
    """Asynchronous on-policy distillation on Ray: run, measure, admit, sweep."""


_set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="FIELD=VALUE",
    help="Override a config field, e.g. --set train.lr=3e-4 (repeatable).",
)


@main.command()
@click.argument("pipeline")
@_set_option
def validate(pipeline: str, overrides: tuple[str, ...]) -> None:
    """Load and validate PIPELINE (path.py[:function]) without starting Ray."""
    import json

    from opdflow.config import load_pipeline

    cfg = load_pipeline(pipeline, list(overrides))
    click.echo(json.dumps(cfg.to_dict(), indent=2))
    click.secho(f"{pipeline}: valid", fg="green", err=True)


@main.command()
@click.argument("pipeline")
@_set_option
@click.option("--steps", type=int, default=None, help="Learner steps (overrides train.steps).")
@click.option(
    "--run-dir", type=click.Path(), default=None, help="Run directory (default runs/NAME-TIME)."
)
def run(pipeline: str, overrides: tuple[str, ...], steps: int | None, run_dir: str | None) -> None:
    """Run PIPELINE: on-policy distillation on an embedded local Ray cluster or RAY_ADDRESS."""
    from opdflow.config import load_pipeline

    extra = list(overrides) + ([f"train.steps={steps}"] if steps is not None else [])
    cfg = load_pipeline(pipeline, extra)
    from opdflow.console import run_with_progress

    run_with_progress(cfg, run_dir)


from opdflow.commands import jobs as _jobs  # noqa: E402

main.add_command(_jobs.submit)
main.add_command(_jobs.status)
main.add_command(_jobs.logs)
main.add_command(_jobs.stop)
