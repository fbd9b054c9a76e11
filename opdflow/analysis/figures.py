"""A run's figures, each defined once, and the one way each is printed.

The run summary (summary.py, `opdflow run`), the report (report.py), the sweep table
(throughput.py, `opdflow sweep`) and the simulator (simulator.py, `opdflow simulate`)
take their numbers from the functions here, so one run gives one trainer wait share, one
updates/hour and one held-out accuracy wherever it is shown.

Warm-up: the first `warmup_steps` steps after the run's clock starts (the run's start, or
its last resume) pay for actors starting and the first weight fetch. The throughput
figures (updates/hour, trainer wait mean and share, what faults cost) leave them out; the
quality figures (held-out KL and accuracy, per evaluated version), the mismatch figures
(token-pooled) and the staleness figures count every step. Each label says which.

Units: FIGURES names every figure (its summary.json field and sweep-table column), its
label and its unit; `show` prints a value in its unit: shares and accuracy in percent with
one decimal, updates/hour whole, seconds with three decimals, KL in nats/token with four,
mismatch with two significant decimals in scientific notation, "n/a" for a missing value.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from opdflow.analysis.curves import accuracy_curve, finite, heldout_curve
from opdflow.analysis.runs import Run

AFTER_WARMUP = "after warm-up"
ALL_STEPS = "all steps"


# ---------------------------------------------------------------- which steps are timed


def clock_start(events: list[dict[str, Any]]) -> int:
    """The step the run's clock (re)started at: its last resume's, else 0."""
    return max((int(e["step"]) for e in events if e.get("event") == "resume"), default=0)


def timed_from(n_steps: int, warmup: int, first: int = 0) -> int:
    """Index of the first step the throughput figures count among `n_steps` steps numbered
    from 0: `first + warmup`, or `first` when no step follows the warm-up (a run shorter
    than its warm-up is timed whole)."""
    start = first + max(warmup, 0)
    return start if n_steps > start else min(first, n_steps)


def timed_rows(metrics: list[dict[str, Any]], warmup: int, first: int = 0) -> list[dict]:
    """The metrics rows the throughput figures count (see `timed_from`)."""
    base = int(metrics[0]["step"]) if metrics else 0  # rows are the steps base, base + 1, ...
    i = timed_from(len(metrics) + base, warmup, max(first, base)) - base
    return metrics[i:]


def per_hour(steps: float, seconds: float) -> float:
    """Steps per wall hour: 3600 * steps / seconds; NaN without a step or a second."""
    return 3600.0 * steps / seconds if steps > 0 and seconds > 0 else math.nan


def wait_share(wait_s: list[float], step_s: list[float]) -> float:
    """Share of the step time the trainer waited for its batch: sum(wait) / sum(step);
    non-finite values are skipped; NaN without step time."""
    total = sum(s for s in step_s if finite(s))
    return sum(w for w in wait_s if finite(w)) / total if total > 0 else math.nan


def mean(values: list[float]) -> float:
    """Mean of the finite values; NaN without any."""
    ok = [float(v) for v in values if finite(v)]
    return sum(ok) / len(ok) if ok else math.nan


def token_pooled(metrics: list[dict[str, Any]], key: str) -> float:
    """Token-pooled mean of a per-step column (each step weighted by its tokens, 1 when a
    row has none); non-finite values are skipped; NaN without any."""
    num = den = 0.0
    for r in metrics:
        v, t = r.get(key), r.get("tokens", 1)
        if v is None or not math.isfinite(float(v)):
            continue
        num += float(v) * float(t)
        den += float(t)
    return num / den if den else math.nan


# ---------------------------------------------------------------- one run's figures


@dataclass(frozen=True)
class RunFigures:
    """What a run's summary, the report and the sweep table show of one run."""

    steps: int
    """Learner steps on record."""
    heldout_version_start: int
    heldout_version_end: int
    heldout_kl_start: float
    """Token-pooled held-out KL (nats/token) of the first evaluated version."""
    heldout_kl_end: float
    """The same of the last evaluated version."""
    heldout_kl_change: float
    """(end - start) / start."""
    heldout_accuracy_start: float
    """Share of held-out responses whose answer matches the reference, at the first
    evaluated version; NaN when the held-out prompts have no reference answers."""
    heldout_accuracy_end: float
    """The same at the last evaluated version."""
    updates_per_hour: float
    """Learner steps per wall hour after warm-up (the driver's clock, the last step's)."""
    trainer_wait_s_mean: float
    """Mean seconds the trainer waited for its batch per step, after warm-up."""
    trainer_wait_share: float
    """Share of the step time the trainer waited for its batch, after warm-up."""
    d_engine_k1: float
    """Token-pooled mismatch over all steps (nats/token), as are the five below."""
    d_engine_k3: float
    d_engine_exact: float
    d_stale_k1: float
    d_stale_k3: float
    d_total_k1: float
    max_staleness: int
    """Largest step - version trained, over all steps."""
    k_final: int | None
    """The staleness bound k in effect at the last step (the config's k without rows)."""
    k_mean: float
    """Mean staleness bound k over all steps."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


MISMATCH = ("d_engine_k1", "d_engine_k3", "d_engine_exact", "d_stale_k1", "d_stale_k3",
            "d_total_k1")  # fmt: skip


def run_figures(
    metrics: list[dict[str, Any]],
    heldout: list[dict[str, Any]],
    config: dict[str, Any],
    first: int = 0,
) -> RunFigures:
    """Every figure of one run from its records: metrics rows, held-out rows, its config
    (config.json) and `first`, the step its clock started at (`clock_start`)."""
    nan = math.nan
    timed = timed_rows(metrics, int(config.get("warmup_steps", 0) or 0), first)
    kl = heldout_curve(heldout)
    acc = dict(accuracy_curve(heldout, config.get("data", {}).get("heldout", "tiny")))
    (v0, kl0), (v1, kl1) = (kl[0], kl[-1]) if kl else ((-1, nan), (-1, nan))
    ks = [int(r["k"]) for r in metrics if finite(r.get("k"))]
    return RunFigures(
        steps=len(metrics),
        heldout_version_start=v0,
        heldout_version_end=v1,
        heldout_kl_start=kl0,
        heldout_kl_end=kl1,
        heldout_kl_change=(kl1 - kl0) / kl0 if kl0 else nan,
        heldout_accuracy_start=acc.get(v0, nan),
        heldout_accuracy_end=acc.get(v1, nan),
        updates_per_hour=float(metrics[-1].get("updates_per_hour", nan)) if metrics else nan,
        trainer_wait_s_mean=mean([r.get("trainer_wait_s") for r in timed]),
        trainer_wait_share=wait_share(
            [r.get("trainer_wait_s") for r in timed], [r.get("step_s") for r in timed]
        ),
        **{key: token_pooled(metrics, key) for key in MISMATCH},
        max_staleness=max((int(r["staleness"]) for r in metrics), default=0),
        k_final=ks[-1] if ks else config.get("staleness", {}).get("k"),
        k_mean=mean(ks),
    )


# ---------------------------------------------------------------- labels and units


@dataclass(frozen=True)
class Figure:
    """How a figure is named and printed."""

    label: str
    """Its name in every table, with which steps it counts where that matters."""
    unit: str
    """One of UNITS' keys."""


def _pct(v: float) -> str:
    return f"{v:.1%}"


UNITS = {
    "share": _pct,
    "per_hour": lambda v: f"{v:.0f}",
    "seconds": lambda v: f"{v:.3f} s",
    "nats": lambda v: f"{v:.4f}",
    "mismatch": lambda v: f"{v:.2e}",
    "count": lambda v: f"{int(v)}",
    "ratio": lambda v: f"{v:.2f}x",
    "number": lambda v: f"{v:.2f}",
}
"""How each unit prints a finite value."""

FIGURES = {
    "heldout_kl_start": Figure("held-out KL start (nats/token)", "nats"),
    "heldout_kl_end": Figure("held-out KL end (nats/token)", "nats"),
    "heldout_kl_equal_time": Figure("held-out KL at equal wall time (nats/token)", "nats"),
    "heldout_kl_change": Figure("held-out KL change", "share"),
    "heldout_accuracy_start": Figure("held-out accuracy start", "share"),
    "heldout_accuracy_end": Figure("held-out accuracy end", "share"),
    "updates_per_hour": Figure(f"updates/hour ({AFTER_WARMUP})", "per_hour"),
    "ratio_to_k0": Figure(f"updates/hour vs k=0 ({AFTER_WARMUP})", "ratio"),
    "trainer_wait_s_mean": Figure(f"trainer wait mean ({AFTER_WARMUP})", "seconds"),
    "trainer_wait_share": Figure(f"trainer wait share ({AFTER_WARMUP})", "share"),
    "generator_busy_share": Figure("generator busy share (spans: all steps)", "share"),
    "d_engine_k1": Figure("d_engine k1 (nats/token, all steps)", "mismatch"),
    "d_engine_k3": Figure("d_engine k3 (nats/token, all steps)", "mismatch"),
    "d_engine_exact": Figure("d_engine exact (nats/token, all steps)", "mismatch"),
    "d_stale_k1": Figure(f"d_stale k1 (nats/token, {ALL_STEPS})", "mismatch"),
    "d_stale_k3": Figure(f"d_stale k3 (nats/token, {ALL_STEPS})", "mismatch"),
    "d_total_k1": Figure(f"d_total k1 (nats/token, {ALL_STEPS})", "mismatch"),
    "max_staleness": Figure(f"max staleness ({ALL_STEPS})", "count"),
    "mean_staleness": Figure(f"mean staleness ({ALL_STEPS})", "number"),
    "k_final": Figure("k at the end", "count"),
    "k_mean": Figure(f"k mean ({ALL_STEPS})", "number"),
    "steps": Figure("learner steps", "count"),
    "restart_slowdown": Figure(f"updates/hour lost to restarts ({AFTER_WARMUP})", "share"),
    "lost_share": Figure(f"share of wall time lost ({AFTER_WARMUP})", "share"),
    "share_of_updates_per_hour": Figure(f"share of updates/hour lost ({AFTER_WARMUP})", "share"),
    "updates_per_hour_lost": Figure(f"updates/hour lost ({AFTER_WARMUP})", "per_hour"),
    "wall_s": Figure("wall time", "seconds"),
}
"""Every figure shown in more than one place, by its summary.json field / table column."""


def show(key: str, value: Any) -> str:
    """`value` of figure `key` in its unit; "n/a" for None or NaN; a float of a column that
    is no figure to 4 significant digits; anything else as text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    fig = FIGURES.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if fig is None:
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    return UNITS[fig.unit](value)


def label(key: str) -> str:
    """The label of figure `key` (the key itself for a column that is no figure)."""
    fig = FIGURES.get(key)
    return fig.label if fig else key


def figures_of(run: Run) -> RunFigures:
    """`run_figures` of a run directory (analysis/runs.py's reader)."""
    return run_figures(run.metrics, run.heldout, run.config, clock_start(run.events))
