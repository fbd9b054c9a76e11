"""Budget calibration: where along the mismatch scale D do runs start failing the quality rule?

From finished runs (each with its D and its verdict against the standard run) the bracket is
[largest passing D, smallest failing D]; the line L is the geometric mean of the two ends
(D spans orders of magnitude, so the midpoint is taken in log D). Runs that do not bracket
(all pass, all fail, or a passing D above a failing D) give no line, and say so.

A run's D is its token-pooled d_total_k1 over all its training steps (engine + staleness
mismatch, the paper's D(c)); d_engine is kept beside it. The short calibration interpolates
Delta(D) in log D between the two ladder rungs where Delta crosses tau. Pure code.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opdflow.analysis.figures import token_pooled
from opdflow.errors import ConfigError

D_KIND = "d_total_k1"
"""Which mismatch a run's D is: token-pooled engine + staleness k1 over its training steps."""
LINE_CHOICE = "geometric mean of the bracket ends"


@dataclass(frozen=True)
class RunPoint:
    """One finished run on the calibration scale."""

    run: str
    recipe: str
    d: float
    d_engine: float
    delta: float
    diff_low: float
    diff_high: float
    fails: bool


@dataclass(frozen=True)
class Bracket:
    """The calibration's outcome: where passing ends and failing begins, and the line L."""

    status: str
    """"bracket", "all_pass", "all_fail", "overlap" or "empty"."""
    largest_pass: float | None
    smallest_fail: float | None
    line: float | None
    message: str


def derive_bracket(points: list[RunPoint]) -> Bracket:
    """[largest passing D, smallest failing D] and L = their geometric mean, or why not."""
    passing = [p.d for p in points if not p.fails]
    failing = [p.d for p in points if p.fails]
    lo = max(passing) if passing else None
    hi = min(failing) if failing else None
    if not points:
        return Bracket("empty", None, None, None, "no runs: nothing to calibrate")
    if hi is None:
        return Bracket(
            "all_pass",
            lo,
            None,
            None,
            f"every run passes (largest D = {lo:.4g}): the runs do not bracket a failure; "
            "no line L. A budget up to that D is safe as far as these runs show; add a run "
            "with more mismatch (e.g. a larger noise sigma) to find the failing side.",
        )
    if lo is None:
        return Bracket(
            "all_fail",
            None,
            hi,
            None,
            f"every run fails (smallest D = {hi:.4g}): the runs do not bracket a pass; no "
            "line L. Add a run with less mismatch, e.g. the standard bf16 run itself.",
        )
    if lo >= hi:
        return Bracket(
            "overlap",
            lo,
            hi,
            None,
            f"passing and failing runs overlap (a pass at D = {lo:.4g} >= a fail at "
            f"D = {hi:.4g}): D alone does not separate them here; no line L. Repeat the "
            "runs near the boundary or check the mismatch is measured alike.",
        )
    line = math.sqrt(lo * hi) if lo > 0 else hi / 2
    return Bracket(
        "bracket",
        lo,
        hi,
        line,
        f"bracket [{lo:.4g}, {hi:.4g}] nats/token; L = {line:.4g} ({LINE_CHOICE})",
    )


def crossing_line(points: list[RunPoint], tau: float) -> tuple[float | None, str]:
    """Where Delta(D) crosses tau, interpolated linearly in log D, or why not.

    Only a ladder with one crossing counts: Delta < tau on every rung below it and >= tau
    on every rung above. Short runs are noisy; more than one crossing gives no line."""
    pts = sorted((p for p in points if p.d > 0 and math.isfinite(p.delta)), key=lambda p: p.d)
    crossings = sum((a.delta >= tau) != (b.delta >= tau) for a, b in itertools.pairwise(pts))
    if crossings > 1:
        ladder = ", ".join(f"D={p.d:.3g}: {p.delta:+.1%}" for p in pts)
        return None, (
            f"Delta crosses tau={tau:g} {crossings} times along the ladder ({ladder}): it is "
            "not monotone in D at this run length, so no line; lengthen the short runs or "
            "lower their learning rate"
        )
    for a, b in itertools.pairwise(pts):
        if a.delta < tau <= b.delta:
            f = (tau - a.delta) / (b.delta - a.delta)
            line = math.exp(math.log(a.d) + f * (math.log(b.d) - math.log(a.d)))
            return line, (
                f"Delta crosses tau={tau:g} between D={a.d:.4g} (Delta {a.delta:+.1%}) and "
                f"D={b.d:.4g} (Delta {b.delta:+.1%}): L = {line:.4g} (linear in log D)"
            )
    if pts and all(p.delta < tau for p in pts):
        top = pts[-1]
        return None, (
            f"Delta never reaches tau={tau:g} (largest D = {top.d:.4g} at Delta "
            f"{top.delta:+.1%}): extend the ladder to larger sigma or train longer"
        )
    return None, f"Delta is >= tau={tau:g} already at the smallest D: extend the ladder down"


def points_from_runs(std_path: str | Path, run_paths: list[str | Path], tau: float, **kw):
    """Judge every run against the standard run (the standard run itself included, Delta 0)."""
    from opdflow.analysis.quality import compare_runs, load_run

    std = load_run(std_path)
    out = []
    seen = set()
    for p in [std_path, *run_paths]:
        key = str(Path(p).resolve())
        if key in seen:
            continue
        seen.add(key)
        run = load_run(p)
        v = compare_runs(std, run, tau=tau, **kw)
        metrics = run.metrics
        if not metrics:
            raise ConfigError(f"{run.path}/metrics.parquet is missing or empty: D needs it")
        out.append(
            RunPoint(
                str(run.path),
                run.recipe,
                token_pooled(metrics, D_KIND),
                token_pooled(metrics, "d_engine_k1"),
                v.delta,
                v.diff.low,
                v.diff.high,
                v.fails,
            )
        )
    return out


def step_cost(metrics: list[dict[str, Any]], responses_per_step: int) -> float | None:
    """Median learner-step wall time per response (seconds), for full-run time estimates."""
    import statistics

    steps = [float(r["step_s"]) for r in metrics[2:] if "step_s" in r] or [
        float(r["step_s"]) for r in metrics if "step_s" in r
    ]
    if not steps:
        return None
    return statistics.median(steps) / max(responses_per_step, 1)


def budget_dict(
    bracket: Bracket,
    points: list[RunPoint],
    tau: float,
    std_run: str,
    method: str,
    line: float | None = None,
    step_s_per_response: float | None = None,
) -> dict[str, Any]:
    """The budget file `opdflow admit --budget-file` reads."""
    return {
        "line_nats": line if line is not None else bracket.line,
        "d_kind": D_KIND,
        "method": method,
        "choice": LINE_CHOICE if method == "runs" else "Delta = tau, linear in log D",
        "bracket": [bracket.largest_pass, bracket.smallest_fail],
        "status": bracket.status,
        "tau": tau,
        "std_run": std_run,
        "step_s_per_response": step_s_per_response,
        "runs": [asdict(p) for p in points],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_budget(path: str | Path, budget: dict[str, Any]) -> None:
    if budget.get("line_nats") is None:
        raise ConfigError("no line L to write: the runs do not bracket (see the message above)")
    Path(path).write_text(json.dumps(budget, indent=2) + "\n")
