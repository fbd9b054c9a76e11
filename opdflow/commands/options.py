"""Options more than one command takes, declared once so each means the same everywhere.

A command stacks them as decorators (`@pipeline_argument`, `@set_option`, ...) in the order
its --help should list them. Only click is imported here: `opdflow --help` stays instant.
"""

from __future__ import annotations

from collections.abc import Callable

import click

pipeline_argument = click.argument("pipeline")
"""PIPELINE: a pipeline file, path.py[:function] (default function `pipeline`)."""

set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="FIELD=VALUE",
    help="Override a config field, e.g. --set train.lr=3e-4 (repeatable).",
)
"""--set FIELD=VALUE, repeatable: reaches every config field (opdflow/config/overrides.py)."""

steps_option = click.option(
    "--steps", type=int, default=None, help="Learner steps (overrides train.steps)."
)
"""--steps N: the run's learner steps, the same as --set train.steps=N."""

ks_option = click.option(
    "--k",
    "ks",
    default="0,1,2,4,8",
    show_default=True,
    help="Staleness bounds; 'adaptive' adds the adaptive policy (k_max = largest k).",
)
"""--k: the staleness bounds a sweep runs or a simulation projects, comma-separated."""

seed_option = click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed.")
"""--seed: the sampling seed of an in-process measurement."""

tau_option = click.option(
    "--tau",
    type=float,
    default=0.20,
    show_default=True,
    help="Quality tolerance: a run fails at Delta >= tau (with the interval excluding 0).",
)
"""--tau: the quality rule's tolerance, shared by compare, calibrate and study run."""


def json_option(what: str) -> Callable[[Callable], Callable]:
    """--json: print `what` (e.g. "the verdict") as JSON on stdout instead of a table."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print {what} as JSON on stdout.")


address_option = click.option(
    "--address",
    envvar="RAY_ADDRESS",
    default=None,
    metavar="URL",
    help="Ray dashboard (Jobs API) address, e.g. http://HEAD:8265 (default: $RAY_ADDRESS).",
)
"""--address: the Ray Jobs API a remote command talks to."""

token_option = click.option(
    "--token",
    default=None,
    metavar="TOKEN",
    help="Ray auth token of the cluster (sets RAY_AUTH_MODE=token and RAY_AUTH_TOKEN).",
)
"""--token: the cluster's Ray auth token."""
