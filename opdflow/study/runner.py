"""Running the study: every arm of the plan trained, judged and read for its claims.

One driver Session trains every (arm, seed) of the plan; a finished run with the same
config is reused and an unfinished one resumed, so an interrupted study continues where it
stopped. The admission decisions are made before any training, the gradient probes after,
and results.json holds it all (results.py); `opdflow study run` is this module's face.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from opdflow.driver.session import Session
    from opdflow.study.plan import Arm, Scale
    from opdflow.study.results import RunResult


def run_study(
    quick: bool,
    out: str | None,
    tau: float,
    line: float | None,
    overrides: tuple[str, ...],
    err: Console,
) -> Path:
    """Train every arm, decide admission first, probe gradients; write and return the path
    of results.json. `err`: where progress and the claims' verdicts are printed."""
    from opdflow.cluster.connection import quiet_env
    from opdflow.core.duration import duration
    from opdflow.driver.session import Session
    from opdflow.study.claims import claims
    from opdflow.study.plan import ADMISSION_LINE, plan
    from opdflow.study.results import StudyResults, bracket_of, judge_all

    quiet_env()
    scale, arms = plan(quick)
    root = Path(out or f"runs/study-{scale.name}")
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = StudyResults(scale=scale.__dict__, tau=tau, machine=_machine())
    admission = _admission(scale, arms, line or ADMISSION_LINE, overrides, err)
    with Session() as session:
        todo = [(a, s) for a in arms for s in a.seeds]
        res.runs = _train(session, scale, todo, root, overrides, err)
        judge_all(res, tau)
        if scale.name == "full":  # a second seed where the first verdict is near tau
            again = [(a, 1) for a in _repeats(arms, res, tau)]
            res.runs += _train(session, scale, again, root, overrides, err, "repeat ")
            judge_all(res, tau)
    res.bracket = bracket_of(res.runs)
    res.admission = _outcomes(admission, res)
    res.gradient = _probes(scale, res, overrides, err)
    res.claims = claims(res)
    (root / "results.json").write_text(json.dumps(res.to_dict(), indent=2, default=str))
    err.print(f"study {scale.name}: {len(res.runs)} runs in {duration(time.perf_counter() - t0)}")
    for c in res.claims:
        mark = {True: "holds", False: "does not hold", None: "undecided"}[c.holds]
        err.print(f"  {c.number}. {c.finding}: {mark}. {c.found}")
    return root / "results.json"


def _machine() -> dict:
    import os
    import platform

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "cores": "generator, learner: 1 Ray CPU + 1 torch thread each; rescorer, teacher, "
        "evaluator: 0 Ray CPU + 1 thread (shared cores)",
    }


def _config(scale, arm, seed: int, overrides):
    from opdflow.config.overrides import apply_overrides
    from opdflow.testbed.tiny import worked

    return apply_overrides(worked(), [*arm.overrides(scale, seed), *overrides])


def _admission(scale, arms, line: float, overrides, err) -> list[dict]:
    """Experiment 6, before any training: the admission check of every ladder engine."""
    from opdflow.analysis.admission import Budget, decide
    from opdflow.analysis.measure import MeasureSession
    from opdflow.study.plan import Arm

    recipes = list(dict.fromkeys(a.recipe for a in arms if a.experiment == "ladder"))
    cfg = _config(scale, Arm("ladder"), 0, overrides)
    budget = Budget(line, "calibrated before the study (opdflow.study.plan.ADMISSION_LINE)")
    with err.status("admission checks: loading the student"):
        session = MeasureSession(cfg, scale.admission_prompts, scale.admission_responses)
    out = []
    for recipe in recipes:
        with err.status(f"admission check {recipe}"):
            m = session.measure(recipe)
        d = decide(cfg, m, budget).to_dict()
        out.append(d)
        err.print(f"admission {recipe}: D_hat {m.d_k1:.3g} -> {d['decision']} ({m.seconds:.1f} s)")
    return out


def _train(session, scale, todo: list, root: Path, overrides, err, label: str = "") -> list:
    """Train (or reuse) each (arm, seed) of `todo` in `session`."""
    return [
        train_one(session, scale, arm, seed, root, overrides, err, f"[{label}{i}/{len(todo)}]")
        for i, (arm, seed) in enumerate(todo, 1)
    ]


def _repeats(arms, res, tau: float) -> list:
    """Ladder arms whose seed-0 verdict lies near tau (needs_repeat): they get seed 1."""
    from opdflow.study.plan import needs_repeat

    seed0 = {r.arm: r for r in res.runs if r.seed == 0 and r.verdict is not None}
    std_seeds = {r.seed for r in res.runs if r.arm == arms[0].name}
    return [
        a
        for a in arms
        if a.experiment == "ladder"
        and not a.is_standard
        and 1 not in a.seeds
        and 1 in std_seeds
        and a.name in seed0
        and needs_repeat(seed0[a.name].verdict, tau)
    ]


def train_one(
    session: Session, scale: Scale, arm: Arm, seed: int, root: Path, overrides, err, tag: str
) -> RunResult:
    """Train one (arm, seed) in ROOT/runs/<arm>-seed<seed>, or reuse the finished run of the
    same config there (a run of another config is refused, never overwritten)."""
    from rich.markup import escape

    from opdflow.core.duration import duration
    from opdflow.study.results import run_result

    cfg = _config(scale, arm, seed, overrides)
    path = root / "runs" / f"{arm.slug}-seed{seed}"
    label = escape(f"{tag} {arm.name} seed {seed}")  # "[repeat 1/7]" is not rich markup
    with err.status(f"{label}: starting") as status:
        out = session.run(
            cfg,
            path,
            reuse=True,
            on_step=lambda r: status.update(f"{label}: step {r['step'] + 1}/{scale.steps}"),
        )
    res = run_result(arm, seed, path, out.seconds)
    if out.reused:
        err.print(f"{label}: reusing {escape(str(path))}")
    else:
        err.print(
            f"{label}: {duration(out.seconds)}, D {res.d:.3g}, held-out KL "
            f"{res.kl_start:.4f} -> {res.kl_final:.4f}, accuracy {res.acc_final:.1%}"
        )
    return res


def _outcomes(admission: list[dict], res) -> list[dict]:
    """Each admission decision next to the full-run verdict of its engine (k = 0, OPD)."""
    from opdflow.analysis.admission import admits
    from opdflow.study.results import arm_verdict, canonical

    for a in admission:
        rs = [
            r
            for r in res.runs
            if r.experiment == "ladder" and canonical(r.recipe) == a["recipe"] and r.k == 0
        ]
        a["outcome"] = arm_verdict(rs) if rs else "-"
        if res.bracket.get("line"):  # the study's own line, known only after training
            a["line_hindsight"] = res.bracket["line"]
            a["decision_hindsight"] = (
                "ADMIT" if admits(a["d_hat"], res.bracket["line"], a["alpha"]) else "REJECT"
            )
        a["run_seconds"] = sum(r.seconds for r in rs) / len(rs) if rs else None
        a["d_train"] = sum(r.d for r in rs) / len(rs) if rs else None
    return admission


def _probes(scale, res, overrides, err) -> list[dict]:
    """Experiments 5 and 7: gradient errors at the untrained student and the trained one."""
    from opdflow.analysis.gradient_error import GradientProbe
    from opdflow.record.checkpoint import checkpoints_dir, load_latest, read_state
    from opdflow.study.plan import PROBE_FAIL, PROBE_PASS, Arm

    cfg = _config(scale, Arm("ladder"), 0, overrides)
    std = next(r for r in res.runs if r.arm == Arm("ladder").name and r.seed == 0)
    ckpt = load_latest(checkpoints_dir(Path(std.path), cfg.reliability.checkpoint_dir))
    students = [("untrained", None)]
    if ckpt is not None:
        students.append((f"step {ckpt.step}", read_state(ckpt.path)))
    out = []
    for label, weights in students:
        probe = GradientProbe(
            cfg, weights, label, scale.probe_prompts, scale.probe_responses, seed=0
        )
        for recipe in (PROBE_PASS, PROBE_FAIL):
            with err.status(f"gradient probe {recipe} at the {label} student"):
                g = probe.errors(recipe)
            out.append(g.to_dict())
            err.print(
                f"gradient {recipe} @ {label}: update {g.update:.3g}, prefix shift "
                f"{g.prefix_shift:.3g}, per-token {g.per_token:.3g}, floor {g.floor:.3g}"
            )
    return out
