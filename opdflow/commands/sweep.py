"""`opdflow sweep`: one pipeline at several staleness bounds k, in one Ray cluster.

Writes DIR/k<k>/ (a normal run directory per k), DIR/sweep.parquet (the table),
DIR/sweep.png (the curves) and prints the table. The runs are driver/sweep.py's; the knee
rule is in opdflow/analysis/throughput.py.
"""

from __future__ import annotations

import click

from opdflow.commands.options import ks_option, pipeline_argument, set_option, steps_option

COLUMNS = [
    "run",
    "k_final",
    "updates_per_hour",
    "ratio_to_k0",
    "trainer_wait_share",
    "heldout_accuracy_end",
    "heldout_kl_end",
    "heldout_kl_equal_time",
    "d_stale_k1",
    "wall_s",
    "knee",
]
"""The printed table's columns (sweep.parquet has them all); each figure is labelled and
printed as analysis/figures.py says, as in the run summary and the report."""


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
    from rich.console import Console
    from rich.table import Table

    from opdflow.analysis.figures import label, show
    from opdflow.analysis.throughput import KNEE_SHARE

    t = Table(title="opdflow sweep: throughput vs staleness bound k")
    for key in COLUMNS:
        t.add_column(label(key), justify="right")
    for r in rows:
        t.add_row(*[("yes" if r[k] else "") if k == "knee" else show(k, r[k]) for k in COLUMNS])
    console = Console()
    console.print(t)
    console.print(
        f"knee: smallest fixed k reaching {KNEE_SHARE:.0%} of the best fixed k's updates/hour; "
        f"held-out KL at equal wall time: interpolated at the shortest run's wall time "
        f"({show('wall_s', rows[0]['equal_time_s'])})"
    )
