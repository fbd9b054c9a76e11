"""The paper's findings, each read off a study's results by one short function.

Every function takes the Evidence of one study (its results, runs by arm, the OPD ladder,
the standard engine's D) and returns the Claims it can speak to: none where the study's
arms and probes cannot, several where a finding is checked per objective. CLAIMS lists
them in the order docs/STUDY.md shows them; `claims` runs them all.
Pure code: nothing here imports Ray or torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opdflow.study.plan import PROBE_FAIL, PROBE_PASS, STANDARD, Arm
from opdflow.study.results import (
    Claim,
    RunResult,
    StudyResults,
    arm_verdict,
    canonical,
    finite_mean,
    group,
)


@dataclass(frozen=True)
class Evidence:
    """What several claims read, computed once from a study's results."""

    res: StudyResults
    by_arm: dict[str, list[RunResult]]
    """Runs by arm name, in plan order."""
    ladder: dict[str, list[RunResult]]
    """The OPD ladder's arms (experiments 1, 2, 6)."""
    d_std: float
    """The standard engine's D (exact where measured, else k1), averaged over seeds."""

    @classmethod
    def of(cls, res: StudyResults) -> Evidence:
        by = group(res.runs)
        std = [r for r in res.runs if r.arm == Arm("ladder").name]
        d_std = finite_mean([r.d_engine_exact for r in std]) or finite_mean(
            [r.d_engine for r in std]
        )
        ladder = {n: rs for n, rs in by.items() if rs[0].experiment == "ladder"}
        return cls(res, by, ladder, d_std)


def mismatch_budget(e: Evidence) -> list[Claim]:
    """1. The standard engine's D is tiny; runs pass far above it."""
    passing = [
        finite_mean([r.d for r in rs]) for rs in e.ladder.values() if arm_verdict(rs) == "PASS"
    ]
    if not passing or not e.d_std > 0:
        return []
    best = max(passing)
    return [
        Claim(
            1,
            "OPD tolerates mismatch far above the standard engine's",
            "all D <= 0.184 pass: > 200x the standard engine's D = 0.0008",
            f"standard engine D = {e.d_std:.2g}; largest passing D = {best:.3g} "
            f"({best / e.d_std:,.0f}x); bracket: {e.res.bracket.get('message', '-')}",
            best / e.d_std >= 10,
        )
    ]


def staleness_is_cheap(e: Evidence) -> list[Claim]:
    """2. d_stale at the largest k against the quantized engines' d_engine."""
    stale = {r.k: r.d_stale for rs in e.ladder.values() for r in rs if r.recipe == STANDARD and r.k}
    if not stale:
        return []
    quant = {
        rs[0].recipe: finite_mean([r.d_engine for r in rs])
        for rs in e.ladder.values()
        if rs[0].k == 0 and rs[0].recipe != STANDARD and not rs[0].recipe.startswith("noise")
    }
    kmax = max(stale)
    cheaper = [q for q, d in quant.items() if d > stale[kmax]]
    compared = (
        f"; below d_engine of {len(cheaper)}/{len(quant)} quantized engines "
        f"({', '.join(f'{q} {quant[q]:.3g}' for q in sorted(quant))})"
        if quant
        else "; no quantized engine in this plan to compare with"
    )
    return [
        Claim(
            2,
            "Staleness alone is cheap",
            "8 versions old: D = 0.0028, far below the quantized engines",
            f"d_stale at k = {kmax}: {stale[kmax]:.3g}{compared}; d_engine(bf16) = {e.d_std:.2g}",
            (len(cheaper) >= len(quant) / 2) if quant else None,
        )
    ]


def staleness_at_a_higher_rate(e: Evidence) -> list[Claim]:
    """2. The plan's staleness-lr arms (10x the rate) against the standard at that rate."""
    slow = [r for r in e.res.runs if r.experiment == "staleness-lr" and r.k and r.verdict]
    if not slow:
        return []
    r = max(slow, key=lambda x: x.k)
    return [
        Claim(
            2,
            "Staleness costs more when each step moves the student further",
            "(the paper's lr 1e-6 on a 7B student moves it little per step)",
            f"at lr {r.lr:g}: d_stale at k = {r.k} is {r.d_stale:.3g}, Delta "
            f"{r.verdict['delta']:+.1%} against the standard at that rate "
            f"({r.verdict['decision']})",
            r.verdict["fails"],
        )
    ]


def rl_breaks_where_opd_passes(e: Evidence) -> list[Claim]:
    """3. On the same engines, REINFORCE and GRPO break where OPD still passes."""
    opd_by_recipe = {
        canonical(rs[0].recipe): arm_verdict(rs)
        for rs in e.ladder.values()
        if rs[0].k == 0 and arm_verdict(rs) in ("PASS", "FAIL")
    }
    out = []
    for loss in ("reinforce", "grpo"):
        mine = [r for r in e.res.runs if r.loss == loss and not r.center and r.breaks is not None]
        pairs = [
            (r, opd_by_recipe[canonical(r.recipe)])
            for r in mine
            if canonical(r.recipe) in opd_by_recipe
        ]
        if not pairs:
            continue
        rl_only = [r for r, o in pairs if r.breaks and o == "PASS"]
        opd_only = [r for r, o in pairs if not r.breaks and o == "FAIL"]
        broke = [r.d for r in mine if r.breaks]
        first = (
            f"; {loss} first breaks at {min(broke) / e.d_std:,.0f}x the standard engine's D"
            if broke and e.d_std > 0
            else ""
        )
        out.append(
            Claim(
                3,
                f"{loss.upper()} breaks where OPD still passes",
                "REINFORCE and GRPO break at ~12x and ~60x the standard engine's D; OPD "
                "passes > 200x",
                "; ".join(
                    f"{r.recipe} (D {r.d:.3g}): {loss} {'BREAKS' if r.breaks else 'holds'}, OPD {o}"
                    for r, o in pairs
                )
                + first,
                bool(rl_only) and not opd_only,
            )
        )
    return out


def _centering_pairs(e: Evidence, exp: str, loss: str) -> list[tuple[str, float, float]]:
    """(recipe, plain metric, centered metric) of each centered arm of `exp` and `loss`, over
    the centered arm's seeds: Delta for OPD (the standard's is 0), held-out accuracy for RL."""
    rows = []
    for rs in e.by_arm.values():
        c = rs[0]
        if c.loss != loss or not c.center or c.experiment != exp:
            continue
        plain = [
            r
            for r in e.res.runs
            if r.loss == loss
            and not r.center
            and r.recipe == c.recipe
            and r.k == c.k
            and r.lr == c.lr
            and r.seed in {x.seed for x in rs}
            and r.experiment in ("ladder", "rl")
        ]
        if not plain:
            continue
        metric: Callable[[RunResult], float] = (
            (lambda r: r.verdict["delta"] if r.verdict else 0.0)
            if loss == "opd"
            else (lambda r: r.acc_final)
        )
        rows.append(
            (
                c.recipe,
                finite_mean([metric(r) for r in plain]),
                finite_mean([metric(r) for r in rs]),
            )
        )
    return rows


def centering_does_not_help_opd(e: Evidence) -> list[Claim]:
    """4. Score centering leaves OPD's Delta where it was."""
    opd_c = _centering_pairs(e, "centering", "opd")
    if not opd_c:
        return []
    helps = [cen < pl - 0.05 for _, pl, cen in opd_c if math.isfinite(pl) and math.isfinite(cen)]
    return [
        Claim(
            4,
            "Score centering does not help OPD",
            "centering rescues RL but does not help OPD",
            "OPD Delta plain -> centered: "
            + "; ".join(f"{r} {pl:+.1%} -> {cen:+.1%}" for r, pl, cen in opd_c),
            not any(helps) if helps else None,
        )
    ]


def centering_helps_rl(e: Evidence) -> list[Claim]:
    """4. Score centering raises REINFORCE's and GRPO's held-out accuracy."""
    out = []
    for loss in ("reinforce", "grpo"):
        rl_c = _centering_pairs(e, "rl", loss)
        if not rl_c:
            continue
        gains = [cen - pl for _, pl, cen in rl_c if math.isfinite(pl) and math.isfinite(cen)]
        out.append(
            Claim(
                4,
                f"Score centering helps {loss.upper()}",
                "centering rescues RL",
                f"{loss} held-out accuracy plain -> centered: "
                + "; ".join(f"{r} {pl:.1%} -> {cen:.1%}" for r, pl, cen in rl_c),
                (finite_mean(gains) > 0.01) if gains else None,
            )
        )
    return out


def _untrained(e: Evidence) -> dict[str, dict[str, Any]]:
    """The gradient probes at the untrained student, by recipe."""
    return {g["recipe"]: g for g in e.res.gradient if g["student"] == "untrained"}


def prefix_shift_grows_faster(e: Evidence) -> list[Claim]:
    """5. From a passing to a failing noise level, prefix shift grows more than per-token error."""
    untrained = _untrained(e)
    if PROBE_PASS not in untrained or PROBE_FAIL not in untrained:
        return []
    a, z = untrained[PROBE_PASS], untrained[PROBE_FAIL]
    shift_growth = z["prefix_shift"] / a["prefix_shift"]
    tok_growth = z["per_token"] / a["per_token"]
    return [
        Claim(
            5,
            "Prefix-shift error grows faster than per-token error",
            "from a passing to a failing noise level: prefix shift 5.3x, per-token 2.1x",
            f"{PROBE_PASS} -> {PROBE_FAIL}: prefix shift {shift_growth:.1f}x, per-token "
            f"{tok_growth:.1f}x (sampling-noise floor {a['floor']:.3g} vs prefix shift "
            f"{a['prefix_shift']:.3g} -> {z['prefix_shift']:.3g})",
            shift_growth > tok_growth,
        )
    ]


def admission_matches_outcomes(e: Evidence) -> list[Claim]:
    """6. The admission decisions made before training against the full runs' verdicts."""
    res = e.res
    if not res.admission:
        return []
    rows = [a for a in res.admission if a.get("outcome") in ("PASS", "FAIL")]
    match = [a for a in rows if (a["decision"] == "ADMIT") == (a["outcome"] == "PASS")]
    later = [
        a for a in rows if (a.get("decision_hindsight") == "ADMIT") == (a["outcome"] == "PASS")
    ]
    ratio = finite_mean([a["run_seconds"] / a["seconds"] for a in rows if a.get("seconds")])
    return [
        Claim(
            6,
            "Admission decisions made before training match the outcomes",
            "8 of 8 decisions matched; 24 min of checks vs 5.5-6 h per full run; "
            "L = 0.184 in hindsight would also keep all eight",
            f"{len(match)} of {len(rows)} decisions matched with the line fixed before "
            f"(L = {res.admission[0]['line']:.3g}, alpha 1.5); with this study's own line "
            f"in hindsight (L = {res.bracket.get('line') or math.nan:.3g}) {len(later)} of "
            f"{len(rows)}; a check costs 1/{ratio:.0f} of a training run "
            "(engine load excluded)",
            (len(match) == len(rows)) if rows else None,
        )
    ]


def late_training_is_more_sensitive(e: Evidence) -> list[Claim]:
    """7. The error-to-update ratio at the trained student against the untrained one."""
    untrained = _untrained(e)
    late = [g for g in e.res.gradient if g["student"] != "untrained" and g["recipe"] in untrained]
    out = []
    for g in late:
        u = untrained[g["recipe"]]
        out.append(
            Claim(
                7,
                "Late training is more sensitive to mismatch",
                "error-to-update ratio 0.93 at the untrained student, 1.88 at step 200",
                f"{g['recipe']}: total error / update {u['total_ratio']:.2f} untrained -> "
                f"{g['total_ratio']:.2f} at {g['student']} (prefix shift alone "
                f"{u['prefix_shift_ratio']:.2f} -> {g['prefix_shift_ratio']:.2f}; update norm "
                f"{u['update']:.3g} -> {g['update']:.3g})",
                g["total_ratio"] > u["total_ratio"],
            )
        )
    return out


CLAIMS: tuple[Callable[[Evidence], list[Claim]], ...] = (
    mismatch_budget,
    staleness_is_cheap,
    staleness_at_a_higher_rate,
    rl_breaks_where_opd_passes,
    centering_does_not_help_opd,
    centering_helps_rl,
    prefix_shift_grows_faster,
    admission_matches_outcomes,
    late_training_is_more_sensitive,
)
"""Every finding's function, in the order the claims are listed."""


def claims(res: StudyResults) -> list[Claim]:
    """Each of the paper's findings that this study's arms and probes can speak to."""
    e = Evidence.of(res)
    return [c for finding in CLAIMS for c in finding(e)]
