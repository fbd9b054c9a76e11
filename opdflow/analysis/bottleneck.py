"""Which stage limits a run's throughput, in one plain-language line.

Two shares decide it: how much of its step time the trainer waits for a ready batch (from
metrics) and how busy the generators are (from spans when the profiler recorded them, else
from the per-step gen_s). Warm-up steps are left out when later steps exist. Pure
functions: the report prints the line per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opdflow.analysis.curves import finite
from opdflow.analysis.figures import clock_start, figures_of, show, timed_rows, wait_share
from opdflow.analysis.runs import Run
from opdflow.record.profiler import union_seconds

WAIT_BOUND = 0.10
"""Trainer wait share (of learner step time) at or above which a run is generation-bound."""
IDLE_BOUND = 0.25
"""Generator idle share at or above which a run (not generation-bound) is trainer-bound."""


def busy_shares(spans: list[dict[str, Any]]) -> dict[str, float]:
    """Per stage: the share of the spans' wall window its actors were busy, averaged over actors."""
    if not spans:
        return {}
    t0 = min(s["start_s"] for s in spans)
    t1 = max(s["end_s"] for s in spans)
    window = max(t1 - t0, 1e-9)
    per_actor: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in spans:
        per_actor.setdefault((s["stage"], str(s["actor"])), []).append((s["start_s"], s["end_s"]))
    by_stage: dict[str, list[float]] = {}
    for (stage, _), iv in per_actor.items():
        by_stage.setdefault(stage, []).append(union_seconds(iv) / window)
    return {stage: sum(v) / len(v) for stage, v in by_stage.items()}


@dataclass
class Shares:
    """The two numbers the bottleneck rule reads, and where the generator's came from."""

    trainer_wait: float
    generator_busy: float
    source: str


def run_shares(run: Run) -> Shares:
    """Trainer wait share after warm-up (figures.py's, as every table shows it); generator
    busy share from spans, else from gen_s over the same steps."""
    fig = figures_of(run)
    rows = timed_rows(run.metrics, run.warmup_steps, clock_start(run.events))
    if run.spans:
        gen = busy_shares(run.spans).get("generator", float("nan"))
        return Shares(fig.trainer_wait_share, gen, "spans")
    gen = min(wait_share([r.get("gen_s") for r in rows], [r.get("step_s") for r in rows]), 1.0)
    return Shares(fig.trainer_wait_share, gen, "metrics gen_s / step_s")


def bottleneck(
    trainer_wait_share: float,
    generator_busy_share: float,
    k: int | None = None,
    wait_bound: float = WAIT_BOUND,
    idle_bound: float = IDLE_BOUND,
) -> str:
    """One plain-language line saying which stage limits throughput.

    Rule: the trainer waiting for batches at least `wait_bound` of its step time means
    generation is the bottleneck (raise k or add rollout workers); otherwise generators
    idle at least `idle_bound` of the time means the learner is (more rollout workers will
    not help); otherwise the run is balanced.
    """
    if not (finite(trainer_wait_share) and finite(generator_busy_share)):
        return "unknown: not enough timing data to name a bottleneck"
    idle = max(0.0, 1.0 - generator_busy_share)
    wait, idle_pct = (
        show("trainer_wait_share", trainer_wait_share),
        show("generator_busy_share", idle),
    )
    if trainer_wait_share >= wait_bound:
        now = f" (now k={k})" if k is not None else ""
        return (
            f"generation-bound: the trainer waits {wait} of its step time; "
            f"raise k{now} or add rollout workers"
        )
    if idle >= idle_bound:
        return (
            f"trainer-bound: generation idle {idle_pct}; more rollout workers will not help "
            "(a faster learner will)"
        )
    return f"balanced: the trainer waits {wait} of its step time and generation is idle {idle_pct}"
