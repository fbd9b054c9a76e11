"""`opdflow simulate`: project a measured run to more generators, other k, batch and lengths.

Reads RUN_DIR's spans (opdflow/analysis/simulator.py has the model), simulates every (generators,
k) pair, prints a table, writes DIR/simulate.parquet and DIR/simulate.png (updates/hour
vs generators, one line per k) and names the smallest configuration that keeps the
trainer saturated (trainer wait share <= 2%). No Ray, no models: seconds.
"""

from __future__ import annotations

from pathlib import Path

import click

from opdflow.commands.options import ks_option


def parse_ints(text: str, option: str) -> list[int]:
    """'4,8,16' -> [4, 8, 16] with errors naming the option and the bad item."""
    from opdflow.errors import ConfigError

    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        if not item.isdigit() or int(item) < 1:
            raise ConfigError(f"{option} item {item!r} is not allowed: expected integers >= 1")
        out.append(int(item))
    if not out:
        raise ConfigError(f"{option} is empty: give a list, e.g. {option} 4,8,16,32")
    return out


def plot(results, path: str | Path) -> None:
    """Updates/hour vs generators, one line per k (log2 x axis), saturated points filled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    from opdflow.analysis.figures import label as figure_label
    from opdflow.analysis.simulator import SATURATED_WAIT_SHARE
    from opdflow.core.policy import k_label

    ks = list(dict.fromkeys(r.config.k for r in results))
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for k in ks:
        rs = sorted((r for r in results if r.config.k == k), key=lambda r: r.config.generators)
        g = [r.config.generators for r in rs]
        label = k_label(k)
        (line,) = ax[0].plot(g, [r.updates_per_hour for r in rs], "o-", label=label)
        ax[1].plot(g, [r.trainer_wait_share for r in rs], "o-", c=line.get_color(), label=label)
        sat = [r for r in rs if r.trainer_wait_share <= SATURATED_WAIT_SHARE]
        ax[0].plot([r.config.generators for r in sat], [r.updates_per_hour for r in sat], "o",
                   ms=9, mfc="none", c="k")  # fmt: skip
    for a in ax:
        a.set_xscale("log", base=2)
        a.set_xlabel("generator replicas")
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    ax[0].set_ylabel(f"{figure_label('updates_per_hour')}, simulated")
    ax[0].set_title("Throughput (circled: trainer saturated)")
    ax[1].axhline(SATURATED_WAIT_SHARE, ls="--", c="gray", lw=1)
    ax[1].set_ylabel(figure_label("trainer_wait_share"))
    ax[1].yaxis.set_major_formatter(PercentFormatter(1.0))  # shares in percent, as printed
    ax[1].set_title(f"Trainer wait (dashed: {SATURATED_WAIT_SHARE:.0%})")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(results, title: str):
    from rich.table import Table

    from opdflow.analysis.figures import label, show

    t = Table(title=title)
    keys = ("updates_per_hour", "trainer_wait_share", "mean_staleness", "k_final")
    for head in ("generators", "k", *map(label, keys), "dropped"):
        t.add_column(head, justify="right")
    for r in results:
        t.add_row(
            str(r.config.generators),
            str(r.config.k),
            *(show(key, getattr(r, key)) for key in keys),
            str(r.dropped),
        )
    return t


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--generators", default="1,2,4,8", show_default=True, help="Replica counts G.")
@ks_option
@click.option("--batch", type=int, default=None, help="Prompts per step (default: the run's).")
@click.option("--response-length-scale", type=float, default=1.0, show_default=True,
              help="Multiply every response length (and its cap).")  # fmt: skip
@click.option("--learner-speedup", type=float, default=1.0, show_default=True,
              help="Divide the learner's time per token (a faster trainer).")  # fmt: skip
@click.option("--scorer-speedup", type=float, default=1.0, show_default=True,
              help="Divide the rescorer's and teacher's time per token (GPU prefill).")  # fmt: skip
@click.option("--tail", default="empirical", show_default=True,
              help="Response lengths: 'empirical' (the run's) or 'pareto:ALPHA[:CAP]'.")  # fmt: skip
@click.option("--cores", type=float, default=None,
              help="Cores shared by all stages (one small machine); default: each stage has "
              "its own hardware (a cluster).")  # fmt: skip
@click.option("--steps", type=int, default=200, show_default=True, help="Simulated steps.")
@click.option("--replicates", type=int, default=3, show_default=True, help="Seeds averaged.")
@click.option(
    "--out", type=click.Path(), default=None, help="Directory (default RUN_DIR/simulate)."
)
def simulate(
    run_dir: str,
    generators: str,
    ks: str,
    batch: int | None,
    response_length_scale: float,
    learner_speedup: float,
    scorer_speedup: float,
    tail: str,
    cores: float | None,
    steps: int,
    replicates: int,
    out: str | None,
) -> None:
    """Simulate RUN_DIR's pipeline at other scales from its measured stage times."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from rich.console import Console

    from opdflow.analysis.figures import show
    from opdflow.analysis.simulator import (
        SATURATED_WAIT_SHARE,
        SimConfig,
        grid,
        smallest_saturated,
    )
    from opdflow.analysis.stage_times import StageTimes
    from opdflow.core.policy import parse_ks

    gs, kv = parse_ints(generators, "--generators"), parse_ks(ks)
    times = StageTimes.from_run(run_dir)
    base = SimConfig(
        steps=steps,
        prompts_per_step=batch,
        response_length_scale=response_length_scale,
        learner_speedup=learner_speedup,
        scorer_speedup=scorer_speedup,
        tail=tail,
        cores=cores,
    ).validate()
    results = grid(times, gs, kv, base, replicates)
    root = Path(out or Path(run_dir) / "simulate")
    root.mkdir(parents=True, exist_ok=True)
    rows = [{**r.row(), "k": str(r.config.k)} for r in results]
    pq.write_table(pa.Table.from_pylist(rows), root / "simulate.parquet")
    plot(results, root / "simulate.png")
    console = Console()
    prompts = batch or times.prompts_per_step
    console.print(
        table(
            results,
            f"opdflow simulate {run_dir}: {prompts} prompts x {times.responses_per_prompt} "
            f"responses/step, length x{response_length_scale:g} ({tail}), learner "
            f"x{learner_speedup:g}, scorers x{scorer_speedup:g}, "
            f"{f'{cores:g} shared cores' if cores else 'a cluster'}, "
            f"{steps} steps x {replicates} seeds",
        )
    )
    if max(gs) > prompts:
        console.print(f"note: a step's {prompts} prompts make at most {prompts} chunks; more "
                      "generators than that stay idle (raise --batch)")  # fmt: skip
    best = smallest_saturated(results)
    rule = f"trainer wait share <= {SATURATED_WAIT_SHARE:.0%}; fewest generators, then smallest k"
    if best is None:
        console.print(f"no configuration keeps the trainer saturated ({rule})")
    else:
        console.print(
            f"smallest saturated configuration: {best.config.generators} generators, "
            f"k={best.config.k} ({show('updates_per_hour', best.updates_per_hour)} updates/h, "
            f"wait {show('trainer_wait_share', best.trainer_wait_share)}; rule: {rule})"
        )
    click.echo(f"table: {root / 'simulate.parquet'}  plot: {root / 'simulate.png'}")
