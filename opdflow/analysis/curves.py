"""A run's held-out curves: KL and accuracy by weight version, and KL by wall time.

Held-out KL is pooled over tokens per evaluated version (sum of per-prompt KL sums over the
sum of their tokens); version v exists from the end of learner step v - 1 (version 0 at
time 0), which places an evaluation on the run's wall clock. Pure functions over a run's
records; the report plots them, the sweep table reads them at the end and at equal time.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from opdflow.analysis.runs import Run


def finite(x: Any) -> bool:
    """A real, finite number (not None, NaN or infinite)."""
    return isinstance(x, int | float) and math.isfinite(x)


def heldout_curve(heldout: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(version, token-pooled held-out KL) per evaluated version, in version order."""
    by_v: dict[int, list[float]] = {}
    for r in heldout:
        acc = by_v.setdefault(int(r["version"]), [0.0, 0.0])
        acc[0] += r["kl_sum"]
        acc[1] += r["tokens"]
    return [(v, s / max(t, 1.0)) for v, (s, t) in sorted(by_v.items())]


def version_times(metrics: list[dict[str, Any]]) -> dict[int, float]:
    """Wall seconds since the run's start at which each weight version existed.

    Step n's row ends when version n + 1 is published; version 0 exists at time 0.
    """
    return {0: 0.0, **{int(r["step"]) + 1: float(r["time_s"]) for r in metrics}}


def kl_curve(
    metrics: list[dict[str, Any]], heldout: list[dict[str, Any]]
) -> list[tuple[float, float]]:
    """(wall seconds, pooled held-out KL) per evaluated version whose time is known."""
    times = version_times(metrics)
    return [(times[v], kl) for v, kl in heldout_curve(heldout) if v in times]


def kl_at_time(curve: list[tuple[float, float]], t: float) -> float:
    """Held-out KL at wall time t, linear between evaluations (nan outside them)."""
    if not curve or t < curve[0][0] or t > curve[-1][0]:
        return float("nan")
    for (t0, y0), (t1, y1) in itertools.pairwise(curve):
        if t0 <= t <= t1:
            return y0 if t1 == t0 else y0 + (y1 - y0) * (t - t0) / (t1 - t0)
    return curve[-1][1]


def accuracy_curve(heldout: list[dict[str, Any]], source: str = "tiny") -> list[tuple[int, float]]:
    """(version, held-out accuracy) per evaluated version: the share of its held-out
    responses whose answer matches the reference (every prompt has the same number of
    responses). Empty when the held-out prompts (`source`: the config's data.heldout) have
    no reference answers, or their file is not here and every accuracy is 0 (no signal)."""
    from opdflow.inputs.data import heldout_has_answers

    answers = heldout_has_answers(source)
    acc = [r.get("accuracy") for r in heldout]
    if answers is False or not acc or any(not finite(a) for a in acc):
        return []
    if answers is None and not any(acc):  # the prompt file is not here: all-zero is no signal
        return []
    by_v: dict[int, list[float]] = {}
    for r in heldout:
        by_v.setdefault(int(r["version"]), []).append(float(r["accuracy"]))
    return [(v, sum(a) / len(a)) for v, a in sorted(by_v.items())]


def run_accuracy_curve(run: Run) -> list[tuple[int, float]]:
    """`accuracy_curve` of a run directory's held-out rows and prompts."""
    return accuracy_curve(run.heldout, run.config.get("data", {}).get("heldout", "tiny"))
