"""`opdflow calibrate`: the budget line L that `opdflow admit` reads, from finished runs or
from short runs along the noise ladder (--short; the runs are driver/ladder.py's, the line
analysis/calibration.py's)."""

from __future__ import annotations

import json
import sys

import click

from opdflow.commands.options import json_option, set_option, tau_option


def _points_table(points, title: str, console) -> None:
    from rich.table import Table

    from opdflow.commands.console import fmt

    t = Table(title=title)
    for col in ("run", "recipe", "D (d_total)", "d_engine", "Delta", "KL diff 95% CI", "verdict"):
        t.add_column(col, justify="left" if col in ("run", "recipe") else "right")
    for p in sorted(points, key=lambda p: p.d):
        t.add_row(
            p.run,
            p.recipe,
            fmt(p.d, ".4g"),
            fmt(p.d_engine, ".4g"),
            f"{p.delta:+.1%}",
            f"[{p.diff_low:+.4f}, {p.diff_high:+.4f}]",
            "[red]FAIL[/]" if p.fails else "[green]PASS[/]",
        )
    console.print(t)


@click.command()
@click.argument("runs", nargs=-1)
@click.option("--std", "std_run", type=click.Path(), default=None, help="The standard (bf16) run.")
@tau_option
@click.option("--out", type=click.Path(), default=None, help="Write the budget JSON here.")
@click.option("--short", "short", is_flag=True, help="RUNS is one PIPELINE: run the short ladder.")
@click.option(
    "--sigmas",
    default="0.5,1,2,4",
    show_default=True,
    help="--short: noise(sigma) ladder, comma-separated.",
)
@click.option("--steps", type=int, default=10, show_default=True, help="--short: steps per run.")
@click.option(
    "--runs-dir",
    default="runs/calibrate-short",
    show_default=True,
    help="--short: where runs go (finished ones with the same config are reused).",
)
@click.option(
    "--compare-budget",
    type=click.Path(),
    default=None,
    help="--short: a budget file from full runs, to report how far the short L is from it.",
)
@set_option
@json_option("the budget")
def calibrate(
    runs: tuple[str, ...],
    std_run: str | None,
    tau: float,
    out: str | None,
    short: bool,
    sigmas: str,
    steps: int,
    runs_dir: str,
    compare_budget: str | None,
    overrides: tuple[str, ...],
    as_json: bool,
) -> None:
    """Derive the budget line L from finished runs (RUN ... --std RUN_STD), or from short
    runs along the noise ladder (--short PIPELINE). Writes --out for `opdflow admit`."""
    from rich.console import Console

    from opdflow.analysis.calibration import (
        budget_dict,
        crossing_line,
        derive_bracket,
        points_from_runs,
        step_cost,
        write_budget,
    )
    from opdflow.analysis.quality import load_run
    from opdflow.errors import ConfigError

    c = Console(stderr=as_json)  # with --json, stdout carries only the JSON
    if short:
        if len(runs) != 1 or std_run:
            raise click.UsageError("--short takes exactly one PIPELINE and no --std")
        try:
            ladder = sorted(float(s) for s in sigmas.split(",") if s.strip())
        except ValueError as exc:
            raise ConfigError(f"--sigmas {sigmas!r}: expected numbers, e.g. 0.5,1,1.5") from exc
        if not ladder or steps < 1:
            raise ConfigError("--short needs at least one sigma and --steps >= 1")
        from opdflow.commands.console import RunLines
        from opdflow.driver.ladder import run_ladder

        paths = run_ladder(
            runs[0], list(overrides), ladder, steps, runs_dir, RunLines(Console(stderr=True))
        )
        std_run, run_list = str(paths[0]), [str(p) for p in paths[1:]]
    else:
        if not std_run or not runs:
            raise click.UsageError("give finished runs and the standard one: RUN ... --std RUN_STD")
        run_list = list(runs)
    points = points_from_runs(std_run, run_list, tau)
    bracket = derive_bracket(points)
    std = load_run(std_run)
    cost = step_cost(
        std.metrics,
        std.config["data"]["prompts_per_step"] * std.config["data"]["responses_per_prompt"],
    )
    _points_table(
        points,
        f"calibration against {std_run} (tau = {tau:.0%}; D = token-pooled d_total_k1 over training)",
        c,
    )
    c.print(f"bracket: {bracket.message}")
    line = bracket.line
    method = "runs"
    if short:
        method = "short"
        line, msg = crossing_line(points, tau)
        c.print(f"short calibration: {msg}")
        if compare_budget and line is not None:
            from opdflow.analysis.admission import load_budget

            full = load_budget(compare_budget)
            c.print(
                f"vs full-run calibration {full.source}: L_short / L_full = "
                f"{line:.4g} / {full.line:.4g} = {line / full.line:.2f}x"
            )
    budget = budget_dict(bracket, points, tau, std_run, method, line, cost)
    if as_json:
        click.echo(json.dumps(budget, indent=2))
    if out:
        if budget["line_nats"] is None:
            c.print(f"[red]no line L: nothing written to {out}[/]")
            sys.exit(1)
        write_budget(out, budget)
        c.print(f"wrote {out}: L = {budget['line_nats']:.4g} nats/token ({budget['choice']})")
    if budget["line_nats"] is None:
        sys.exit(1)
