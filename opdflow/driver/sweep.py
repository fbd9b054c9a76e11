"""A staleness sweep: one pipeline at several bounds k (`opdflow sweep`, the simulator's
validation bench), trained in one Session, tabulated and plotted.

Writes ROOT/k<k>/ (a normal run directory per k; ROOT/adaptive for the adaptive policy),
ROOT/sweep.parquet (the table) and ROOT/sweep.png (the curves). The table's columns and
the knee rule are analysis/throughput.py's.
"""

from __future__ import annotations

from pathlib import Path

from opdflow.cluster.placement import cpu_need
from opdflow.config import PipelineConfig
from opdflow.core.policy import KToken, k_label
from opdflow.driver.session import Session, Unwatched, Watch


def run_sweep(
    cfgs: list[tuple[KToken, PipelineConfig]], root: Path, watch: Watch | None = None
) -> list[dict]:
    """Train every (k token, config) in one Session (a local cluster sized for the largest);
    write and return the table rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from opdflow.analysis.runs import Run
    from opdflow.analysis.throughput import plot_sweep, sweep_rows

    watch = watch or Unwatched()
    root.mkdir(parents=True, exist_ok=True)
    runs = []
    with Session(max(cpu_need(cfg) for _, cfg in cfgs)) as session:
        for k, cfg in cfgs:
            label = k_label(k)
            outcome = session.run_watched(
                watch, f"sweep {label}", cfg, root / label.replace("=", "")
            )
            runs.append(Run(outcome.run.path))
    rows = sweep_rows(runs)
    pq.write_table(pa.Table.from_pylist(rows), root / "sweep.parquet")
    plot_sweep(rows, root / "sweep.png")
    return rows
