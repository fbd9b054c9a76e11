"""The admission check: minutes of measurement that predict whether an engine will hurt hours of training.

Per candidate recipe: `opdflow.analysis.measure.measure_recipes` generates a few responses per
problem with the candidate engine and rescores exactly those tokens with the BF16
student at the same weights, giving D_hat (token-pooled k1, nats/token) with a bootstrap
interval over prompts. ADMIT iff alpha * D_hat <= L, else REJECT. L is a calibrated line
(`opdflow calibrate` writes it to a budget file); without one, the paper's pilot line
L = 0.41 is used and the output says so.

Full-run time estimate (so the saving is visible): train.steps x responses per step x
seconds per response, excluding actor start-up. Seconds per response are measured stage
speeds: the median learner-step wall time / responses per step of a finished run (the
`--against` run, else the standard run recorded in the budget file: every stage, as the
pipeline ran); without either, the admission check's own seconds per response
(generation + rescoring, engine start-up included, teacher and learner not: rough,
marked "~").

Drift (`drift_report`): D measured online in a run's metrics (d_engine_k1 and d_total_k1,
token-pooled per window of steps) over the admission estimate; a ratio above alpha means
the engine drifted past the safety margin the decision assumed.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opdflow.errors import ConfigError

PILOT_LINE = 0.41
"""The paper's pilot line L (nats/token), used only when no budget file is given."""
ALPHA = 1.5
"""The paper's safety margin: admit when alpha * D_hat <= L."""


@dataclass(frozen=True)
class Budget:
    """The line L and where it came from."""

    line: float
    source: str
    step_s_per_response: float | None = None
    bracket: tuple[float | None, float | None] | None = None


def load_budget(path: str | Path | None = None, line: float | None = None) -> Budget:
    """--budget L wins, then --budget-file F; else the paper's pilot line (said so)."""
    if line is not None and path is not None:
        raise ConfigError("give either --budget L or --budget-file F, not both")
    if line is not None:
        if not line > 0:
            raise ConfigError(f"--budget {line} is not allowed: expected a number > 0")
        return Budget(float(line), "--budget (given on the command line)")
    if path is None:
        return Budget(PILOT_LINE, "the paper's pilot line L = 0.41 (no budget file given)")
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"budget file {p} not found (write one with `opdflow calibrate RUN ... --std RUN`)"
        )
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"budget file {p} is not JSON: {exc}") from exc
    value = data.get("line_nats") if isinstance(data, dict) else None
    if not isinstance(value, int | float) or not value > 0:
        raise ConfigError(
            f"budget file {p}: line_nats = {value!r} is not allowed: expected a number > 0"
        )
    bracket = data.get("bracket")
    return Budget(
        float(value),
        f"{p} ({data.get('method', '?')} calibration, {data.get('d_kind', 'D')})",
        data.get("step_s_per_response"),
        tuple(bracket) if isinstance(bracket, list) and len(bracket) == 2 else None,
    )


@dataclass(frozen=True)
class Decision:
    """One candidate's admission decision with its evidence."""

    recipe: str
    d_hat: float
    ci_low: float
    ci_high: float
    alpha: float
    line: float
    admit: bool
    borderline: bool
    """The interval straddles the boundary L / alpha: the decision could flip with more data."""
    seconds: float
    tokens: int
    full_run_s: float
    full_run_is_rough: bool
    """True when estimated from the check itself, not from a finished run's step times."""

    @property
    def decision(self) -> str:
        return "ADMIT" if self.admit else "REJECT"

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "decision": self.decision, "boundary": self.line / self.alpha}


def admits(d_hat: float, line: float, alpha: float = ALPHA) -> bool:
    """The rule: ADMIT iff alpha * D_hat <= L."""
    return bool(alpha * d_hat <= line)


def full_run_seconds(cfg: Any, m: Any, step_s_per_response: float | None) -> tuple[float, bool]:
    """Estimated wall time of the pipeline's full run; True when it is rough (see above)."""
    responses_per_step = cfg.data.prompts_per_step * cfg.data.responses_per_prompt
    if step_s_per_response:
        per_response, rough = float(step_s_per_response), False
    else:
        per_response = m.seconds / max(m.prompts * m.responses_per_prompt, 1)
        rough = True
    return cfg.train.steps * responses_per_step * per_response, rough


def decide(
    cfg: Any, m: Any, budget: Budget, alpha: float = ALPHA, step_s_per_response: float | None = None
) -> Decision:
    """Turn one `Measurement` into a decision (pure; m needs the Measurement fields).

    step_s_per_response: measured stage speed for the full-run estimate (default: the
    budget file's)."""
    if not alpha > 0:
        raise ConfigError(f"--alpha {alpha} is not allowed: expected a number > 0, e.g. 1.5")
    boundary = budget.line / alpha
    full_s, rough = full_run_seconds(cfg, m, step_s_per_response or budget.step_s_per_response)
    return Decision(
        recipe=m.recipe,
        d_hat=m.d_k1,
        ci_low=m.ci_low,
        ci_high=m.ci_high,
        alpha=alpha,
        line=budget.line,
        admit=admits(m.d_k1, budget.line, alpha),
        borderline=bool(m.ci_low <= boundary <= m.ci_high),
        seconds=m.seconds,
        tokens=m.tokens,
        full_run_s=full_s,
        full_run_is_rough=rough,
    )


@dataclass(frozen=True)
class DriftWindow:
    """Online mismatch over a window of learner steps, against the admission estimate."""

    first_step: int
    last_step: int
    d_engine: float
    d_total: float
    ratio_engine: float
    ratio_total: float
    past_margin: bool


def drift_report(
    metrics: list[dict[str, Any]], d_hat: float, alpha: float = ALPHA, windows: int = 4
) -> list[DriftWindow]:
    """Online D (token-pooled per window, plus one row for all steps) over the offline D_hat."""
    from opdflow.analysis.figures import token_pooled

    rows = sorted(metrics, key=lambda r: r["step"])
    if not rows:
        raise ConfigError("the run has no metrics rows: nothing to compare the estimate with")
    n = len(rows)
    cuts = sorted({round(i * n / windows) for i in range(windows + 1)})
    spans = [rows[a:b] for a, b in itertools.pairwise(cuts) if b > a] + [rows]
    out = []
    for span in spans:
        de = token_pooled(span, "d_engine_k1")
        dt = token_pooled(span, "d_total_k1")
        re = de / d_hat if d_hat > 0 else math.inf
        rt = dt / d_hat if d_hat > 0 else math.inf
        out.append(
            DriftWindow(
                int(span[0]["step"]), int(span[-1]["step"]), de, dt, re, rt, bool(re > alpha)
            )
        )
    return out
