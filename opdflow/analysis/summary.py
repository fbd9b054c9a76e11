"""A finished run's summary: held-out KL and accuracy, throughput, mismatch, faults.

What `opdflow run` prints at the end and writes to summary.json, read off the run
directory (metrics, held-out rows, events), so any run directory can be summarised again.
Every figure in it is figures.py's (the report and the sweep table read the same ones);
what faults cost is faults.py's.
"""

from __future__ import annotations

from opdflow.analysis.faults import learner_losses, node_losses, restart_slowdown
from opdflow.analysis.figures import clock_start, run_figures, timed_rows
from opdflow.record.rundir import RunDir


def summarize(run: RunDir, record: list, dropped: int, start_step: int = 0) -> dict:
    """The run's figures (figures.RunFigures: held-out KL and accuracy at the first and
    last evaluated version, updates/hour and trainer wait after warm-up, token-pooled
    mismatch, staleness), stage restarts (per stage, from events.jsonl) with the share of
    updates/hour they cost, each node loss and each learner loss it healed from, and what
    they cost (faults.py). `start_step`: the step this process started at (a resumed run's
    checkpoint; events.jsonl's last resume says the same)."""
    m, events, cfg = run.metrics, run.events(), run.config()
    warmup = int(cfg.get("warmup_steps", 0) or 0)
    first = max(start_step, clock_start(events))
    figures = run_figures(m, run.heldout, cfg, first)
    timed = len(timed_rows(m, warmup, first))  # the steps updates/hour counts
    return {
        "run_dir": str(run.path),
        **figures.as_dict(),
        "live_weight_versions_max": int(max(r["live_weight_versions"] for r in m)),
        "weight_bytes_live_max": int(max(r.get("weight_bytes_live", 0) for r in m)),
        "dropped_batches": dropped,
        "restarts": run.restart_counts(),
        "restart_slowdown": restart_slowdown(m, warmup, first),
        "learner_losses": learner_losses(events, figures.updates_per_hour, timed),
        "node_losses": node_losses(events, m, warmup, first),
        "trained_steps_record": record,
    }
