"""A study's results: finished run directories read into RunResults, judged, and kept.

`run_result` reads what the analysis keeps of one run; `judge` applies the quality rule
(analysis/quality.py) to a run and the run it is judged against (the standard run of its
seed and learning rate, or its RL objective's bf16 run), pairing prompts and stating the
interval; `rl_breaks` says whether an RL run broke; `bracket_of` is experiment 1's
bracket of D. StudyResults is everything docs/STUDY.md shows; results.json its serialised
form. Pure code apart from reading run directories: nothing here imports Ray or torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opdflow.study.plan import STANDARD, Arm

RL_ACC_DROP = 0.05
"""An RL run breaks when it loses this much held-out accuracy against its bf16 run..."""
COLLAPSE = 0.5
"""...or its final entropy or response length falls below this share of its bf16 run's."""


def canonical(recipe: str) -> str:
    """A recipe's serialised text (noise(4) and noise(sigma=4.0) are one engine)."""
    from opdflow.core.recipe import parse_recipe

    return parse_recipe(recipe).text


def _tail(metrics: list[dict[str, Any]], key: str, n: int = 10) -> float:
    vals = [float(r[key]) for r in metrics[-n:] if r.get(key) is not None]
    vals = [v for v in vals if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else math.nan


@dataclass
class RunResult:
    """What the analysis keeps of one finished run."""

    arm: str
    experiment: str
    recipe: str
    k: int
    loss: str
    center: bool
    seed: int
    lr: float
    path: str
    seconds: float
    d: float
    d_engine: float
    d_engine_exact: float
    """Exact full-vocabulary KL(engine || student), pooled: never negative, unlike k1."""
    d_stale: float
    kl_start: float
    kl_final: float
    acc_final: float
    entropy: float
    length: float
    reward: float
    verdict: dict[str, Any] | None = None
    """Against the run it is judged by (standard run, or the RL objective's bf16 run)."""
    breaks: bool | None = None
    """RL only: accuracy fell >= RL_ACC_DROP (interval below 0) or entropy/length collapsed."""


def run_result(arm: Arm, seed: int, path: str | Path, seconds: float) -> RunResult:
    from opdflow.analysis.figures import figures_of
    from opdflow.analysis.quality import load_run

    r = load_run(path)
    fig = figures_of(r)  # held-out KL and accuracy as the summary and the report show them
    return RunResult(
        arm=arm.name,
        experiment=arm.experiment,
        recipe=arm.recipe,
        k=arm.k,
        loss=arm.loss,
        center=arm.center,
        seed=seed,
        lr=float(r.config["train"]["lr"]),
        path=str(path),
        seconds=seconds,
        d=fig.d_total_k1,
        d_engine=fig.d_engine_k1,
        d_engine_exact=fig.d_engine_exact,
        d_stale=fig.d_stale_k1,
        kl_start=fig.heldout_kl_start,
        kl_final=fig.heldout_kl_end,
        acc_final=fig.heldout_accuracy_end,
        entropy=_tail(r.metrics, "entropy"),
        length=_tail(r.metrics, "response_len"),
        reward=_tail(r.metrics, "train_reward"),
    )


def judge(result: RunResult, against: RunResult, tau: float) -> dict[str, Any]:
    """The quality rule of `result` against `against` (paired prompts, same seed)."""
    from opdflow.analysis.quality import compare_runs, load_run

    v = compare_runs(load_run(against.path), load_run(result.path), tau=tau)
    d = v.to_dict()
    d["diff"], d["acc_diff"] = asdict(v.diff), asdict(v.acc_diff)
    return d


def rl_breaks(result: RunResult, base: RunResult, verdict: dict[str, Any]) -> bool:
    """Accuracy fell by >= RL_ACC_DROP with its interval below zero, or entropy or length
    collapsed below COLLAPSE x the bf16 run's."""
    acc = verdict["acc_diff"]
    lost = -acc["estimate"] >= RL_ACC_DROP and acc["high"] < 0
    collapsed = any(
        math.isfinite(a) and math.isfinite(b) and b > 0 and a < COLLAPSE * b
        for a, b in ((result.entropy, base.entropy), (result.length, base.length))
    )
    return bool(lost or collapsed)


@dataclass
class Claim:
    """One of the paper's findings, as this study found it."""

    number: int
    finding: str
    paper: str
    found: str
    holds: bool | None
    """None where this study's runs cannot decide it."""


@dataclass
class StudyResults:
    """Everything docs/STUDY.md shows; results.json is its serialised form."""

    scale: dict[str, Any]
    tau: float
    runs: list[RunResult] = field(default_factory=list)
    admission: list[dict[str, Any]] = field(default_factory=list)
    gradient: list[dict[str, Any]] = field(default_factory=list)
    bracket: dict[str, Any] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StudyResults:
        return cls(
            scale=d["scale"],
            tau=d["tau"],
            runs=[RunResult(**r) for r in d["runs"]],
            admission=d["admission"],
            gradient=d["gradient"],
            bracket=d["bracket"],
            claims=[Claim(**c) for c in d["claims"]],
            machine=d.get("machine", {}),
        )


def group(runs: list[RunResult]) -> dict[str, list[RunResult]]:
    """Runs by arm name, in plan order."""
    out: dict[str, list[RunResult]] = {}
    for r in runs:
        out.setdefault(r.arm, []).append(r)
    return out


def arm_verdict(rs: list[RunResult]) -> str:
    """PASS / FAIL when every seed agrees, else SPLIT (the verdict depends on the seed)."""
    fails = {bool(r.verdict and r.verdict["fails"]) for r in rs if r.verdict}
    if not fails:
        return "-"
    return "SPLIT" if len(fails) > 1 else ("FAIL" if fails.pop() else "PASS")


def finite_mean(xs: list[float]) -> float:
    """The mean of the finite values of `xs`; nan when there are none."""
    xs = [x for x in xs if math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def bracket_of(runs: list[RunResult]) -> dict[str, Any]:
    """Experiment 1's bracket over the OPD ladder: [largest passing D, smallest failing D]."""
    from opdflow.analysis.calibration import RunPoint, derive_bracket

    points = []
    for name, rs in group([r for r in runs if r.experiment == "ladder"]).items():
        verdict = arm_verdict(rs)
        if verdict in ("PASS", "FAIL"):
            points.append(
                RunPoint(
                    name,
                    rs[0].recipe,
                    finite_mean([r.d for r in rs]),
                    0.0,
                    0.0,
                    0.0,
                    0.0,
                    verdict == "FAIL",
                )
            )
    return asdict(derive_bracket(points))


def judge_all(res: StudyResults, tau: float) -> None:
    """Judge every run not judged yet: OPD runs against the standard run of their seed and
    learning rate; RL runs against the bf16 run of their objective (same loss, centering,
    seed and learning rate)."""

    def base_of(r):
        center = r.center and r.loss != "opd"  # OPD + centering is judged by the standard
        want = (STANDARD, 0, r.loss, center, r.seed, r.lr)
        return next(
            (b for b in res.runs if (b.recipe, b.k, b.loss, b.center, b.seed, b.lr) == want),
            None,
        )

    for r in res.runs:
        base = base_of(r)
        if r.verdict is not None or base is None or base is r:
            continue
        r.verdict = judge(r, base, tau)
        if r.loss != "opd":
            r.breaks = rl_breaks(r, base, r.verdict)
