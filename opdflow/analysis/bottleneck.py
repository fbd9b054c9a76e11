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


def timed_rows(run: Run) -> list[dict[str, Any]]:
    """The run's metrics rows after warm-up (config warmup_steps; actor start, first weight
    fetch), or every row when nothing follows the warm-up."""
    warm = run.warmup_steps
    return run.metrics[warm:] if len(run.metrics) > warm else run.metrics


def run_shares(run: Run) -> Shares:
    """Trainer wait share from metrics; generator busy share from spans, else from gen_s."""
    rows = timed_rows(run)
    step_s = sum(r["step_s"] for r in rows if finite(r.get("step_s")))
    wait_s = sum(r["trainer_wait_s"] for r in rows if finite(r.get("trainer_wait_s")))
    wait = wait_s / step_s if step_s > 0 else float("nan")
    if run.spans:
        gen = busy_shares(run.spans).get("generator", float("nan"))
        return Shares(wait, gen, "spans")
    gen_s = sum(r["gen_s"] for r in rows if finite(r.get("gen_s")))
    gen = min(gen_s / step_s, 1.0) if step_s > 0 else float("nan")
    return Shares(wait, gen, "metrics gen_s / step_s")


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
    if trainer_wait_share >= wait_bound:
        now = f" (now k={k})" if k is not None else ""
        return (
            f"generation-bound: the trainer waits {trainer_wait_share:.0%} of its step time; "
            f"raise k{now} or add rollout workers"
        )
    if idle >= idle_bound:
        return (
            f"trainer-bound: generation idle {idle:.0%}; more rollout workers will not help "
            "(a faster learner will)"
        )
    return (
        f"balanced: the trainer waits {trainer_wait_share:.0%} of its step time and "
        f"generation is idle {idle:.0%}"
    )
