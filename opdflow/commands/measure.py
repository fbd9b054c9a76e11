"""`opdflow measure` and `opdflow attribute`: a recipe's mismatch, and where it comes from.

Both run in-process (no Ray, no training): the recipe's engine samples on the pipeline's
held-out prompts at the student's weights and the BF16 student rescores the same tokens.
"""

from __future__ import annotations

import math

import click

from opdflow.commands.options import pipeline_argument, seed_option, set_option


def _fmt(x: float, spec: str = ".2e") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def measurement_table(measurements, title: str):
    """A rich table: recipe, D (k1, k3, exact), 95% interval of k1, tokens, seconds."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("recipe", "D k1", "D k3", "D exact", "95% CI (k1)", "tokens", "seconds"):
        table.add_column(col, justify="left" if col == "recipe" else "right")
    for m in measurements:
        table.add_row(
            m.recipe,
            _fmt(m.d_k1),
            _fmt(m.d_k3),
            _fmt(m.d_exact),
            f"[{_fmt(m.ci_low)}, {_fmt(m.ci_high)}]",
            str(m.tokens),
            f"{m.seconds:.1f}",
        )
    return table


_common = [
    pipeline_argument,
    click.option(
        "--prompts",
        "num_prompts",
        type=int,
        default=32,
        show_default=True,
        help="Held-out prompts to sample on.",
    ),
    click.option(
        "--responses", type=int, default=4, show_default=True, help="Responses per prompt."
    ),
    seed_option,
    set_option,
]


def _with_common(func):
    for deco in reversed(_common):
        func = deco(func)
    return func


@click.command()
@_with_common
@click.option(
    "--recipe",
    "recipes",
    multiple=True,
    required=True,
    help='A recipe, e.g. bf16, fp8, "fp8_kv(kv_bf16_layers=[0])" (repeatable).',
)
@click.option(
    "--out", type=click.Path(), default=None, help="Write the rows to FILE (.parquet, else JSON)."
)
def measure(pipeline, num_prompts, responses, seed, overrides, recipes, out) -> None:
    """Mismatch D of each --recipe against the BF16 student on PIPELINE's held-out prompts."""
    import time

    from rich.console import Console

    from opdflow.analysis.measure import measure_recipes, write_measurements
    from opdflow.config.loader import load_pipeline

    cfg = load_pipeline(pipeline, list(overrides))
    err = Console(stderr=True)
    t0 = time.perf_counter()
    rows = measure_recipes(
        cfg,
        list(recipes),
        num_prompts,
        responses,
        seed,
        on_progress=lambda msg: err.print(f"[dim]{msg}[/dim]"),
    )
    title = (
        f"{cfg.name}: mismatch vs BF16 student, nats/token "
        f"({num_prompts} prompts x {responses} responses, {time.perf_counter() - t0:.0f} s)"
    )
    Console(width=max(Console().width, 130)).print(measurement_table(rows, title))
    if out:
        write_measurements(rows, out)
        err.print(f"wrote {out}")


@click.command()
@_with_common
@click.option("--recipe", required=True, help="The recipe to attribute, e.g. fp8_kv.")
@click.option(
    "--budget",
    type=float,
    default=None,
    help="Escape search target D, nats/token (default: a tenth of the recipe's D).",
)
@click.option("--out", type=click.Path(), default=None, help="Write the result as JSON.")
def attribute(pipeline, num_prompts, responses, seed, overrides, recipe, budget, out) -> None:
    """Per-layer attribution of --recipe's mismatch, then the greedy BF16 escape search."""
    import time

    from rich.console import Console
    from rich.table import Table

    from opdflow.analysis.attribution import attribute as run_attribution
    from opdflow.config.loader import load_pipeline

    cfg = load_pipeline(pipeline, list(overrides))
    err, con = Console(stderr=True), Console(width=max(Console().width, 130))
    t0 = time.perf_counter()
    a = run_attribution(
        cfg,
        recipe,
        budget,
        num_prompts,
        responses,
        seed,
        on_progress=lambda msg: err.print(f"[dim]{msg}[/dim]"),
    )
    con.print(
        measurement_table([a.bf16, a.full, *a.kv_split], f"{cfg.name}: {a.recipe} (D nats/token)")
    )
    table = Table(title=f"{a.recipe}: per-layer attribution (D = exact KL where available)")
    for col in ("layer", "D only this layer", "share", "D all but this layer"):
        table.add_column(col, justify="right")
    for row in a.layers:
        table.add_row(str(row.layer), _fmt(row.only.d), f"{row.share:.1%}", _fmt(row.all_but.d))
    con.print(table)
    steps = ", ".join(f"{m.recipe}: {_fmt(m.d)}" for m in a.escape_path) or "none needed"
    verdict = "reached" if a.reached else "NOT reached"
    con.print(
        f"escape search (budget {_fmt(a.budget)}): keep layers {list(a.escape_layers)} in BF16 "
        f"-> D {_fmt(a.escape.d)} ({verdict}; full recipe {_fmt(a.full.d)}, "
        f"{a.full.d / max(a.escape.d, 1e-12):.1f}x lower)\n  path: {steps}\n"
        f"  ({time.perf_counter() - t0:.0f} s)"
    )
    if out:
        import json
        from dataclasses import asdict
        from pathlib import Path

        Path(out).write_text(json.dumps(asdict(a), indent=2, default=list))
        err.print(f"wrote {out}")
