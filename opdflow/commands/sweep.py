"""`opdflow sweep`: one pipeline at several staleness bounds k, in one Ray cluster.

Writes DIR/k<k>/ (a normal run directory per k), DIR/sweep.parquet (the table),
DIR/sweep.png (the curves) and prints the table. The runs are driver/sweep.py's; the knee
rule is in opdflow/analysis/throughput.py.
"""

from __future__ import annotations

import click

from opdflow.commands.options import ks_option, pipeline_argument, set_option, steps_option

_COLUMNS = [
    ("run", "run", "{}"),
    ("k_final", "k end", "{}"),
    ("updates_per_hour", "updates/h", "{:.0f}"),
    ("ratio_to_k0", "vs k=0", "{:.2f}x"),
    ("trainer_wait_share", "wait", "{:.1%}"),
    ("heldout_kl_end", "KL end", "{:.4f}"),
    ("heldout_kl_equal_time", "KL @ equal t", "{:.4f}"),
    ("d_stale_k1", "d_stale", "{:.2e}"),
    ("wall_s", "wall s", "{:.1f}"),
    ("knee", "knee", "{}"),
]


@click.command()
@pipeline_argument
@ks_option
@steps_option
@click.option(
    "--out", type=click.Path(), default=None, help="Directory (default runs/sweep-NAME-TIME)."
)
@set_option
def sweep(pipeline: str, ks: str, steps: int | None, out: str | None, overrides: tuple) -> None:
    """Run PIPELINE at each staleness bound k; table and plot of updates/hour vs k."""
    import time
    from pathlib import Path

    from rich.console import Console

    from opdflow.commands.console import RunLines
    from opdflow.config import PipelineConfig
    from opdflow.config.loader import load_pipeline
    from opdflow.core.policy import k_label, parse_ks, settings_for, sweep_k_max
    from opdflow.driver.sweep import run_sweep

    values = parse_ks(ks)
    extra = list(overrides) + ([f"train.steps={steps}"] if steps is not None else [])
    base = load_pipeline(pipeline, extra)
    root = Path(out or Path("runs") / f"sweep-{base.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    k_max = sweep_k_max(values, base.staleness.k_max)
    cfgs = []
    for k in values:
        cfg = PipelineConfig.from_dict(base.to_dict())
        cfg.staleness = settings_for(k, cfg.staleness, k_max)
        cfg.name = f"{base.name}-{k_label(k).replace('=', '')}"
        cfgs.append((k, cfg.validate()))
    rows = run_sweep(cfgs, root, RunLines(Console(stderr=True)))
    print_table(rows)
    click.echo(f"table: {root / 'sweep.parquet'}  plot: {root / 'sweep.png'}")


def print_table(rows: list[dict]) -> None:
    import math

    from rich.console import Console
    from rich.table import Table

    from opdflow.analysis.throughput import KNEE_SHARE

    t = Table(title="opdflow sweep: throughput vs staleness bound k")
    for _, head, _ in _COLUMNS:
        t.add_column(head, justify="right")
    for r in rows:
        t.add_row(
            *[
                "n/a"
                if isinstance(r[key], float) and math.isnan(r[key])
                else ("yes" if r[key] is True else "" if r[key] is False else fmt.format(r[key]))
                for key, _, fmt in _COLUMNS
            ]
        )
    console = Console()
    console.print(t)
    console.print(
        f"knee: smallest fixed k reaching {KNEE_SHARE:.0%} of the best fixed k's updates/hour; "
        f"KL @ equal t: held-out KL interpolated at the shortest run's wall time "
        f"({rows[0]['equal_time_s']:.1f} s)"
    )
