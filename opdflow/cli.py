"""The `opdflow` command line: the group and one line per command, each from commands/.

Heavy modules are imported inside the commands, so --help is instant.
"""

from __future__ import annotations

import sys

import click

from opdflow import __version__
from opdflow.commands.calibrate import calibrate
from opdflow.commands.export import export
from opdflow.commands.jobs import logs, status, stop, submit
from opdflow.commands.measure import attribute, measure
from opdflow.commands.quality import admit, compare
from opdflow.commands.report import report
from opdflow.commands.run import run, validate
from opdflow.commands.simulate import simulate
from opdflow.commands.study import study
from opdflow.commands.sweep import sweep
from opdflow.errors import ConfigError


class _Group(click.Group):
    """Turns ConfigError into a one-line message and exit code 2, no traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="opdflow")
def main() -> None:
    """Asynchronous on-policy distillation on Ray: run, measure, admit, sweep."""


for command in (
    validate,
    run,
    report,
    export,
    compare,
    admit,
    calibrate,
    sweep,
    measure,
    attribute,
    simulate,
    submit,
    status,
    logs,
    stop,
    study,
):
    main.add_command(command)

if __name__ == "__main__":
    main()
