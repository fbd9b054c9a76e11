"""The study's plan and analysis (no Ray, no training): what it runs and how it judges."""

from __future__ import annotations

import math

import pytest

from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.core.recipe import parse_recipe
from opdflow.study.claims import claims
from opdflow.study.plan import PROBE_FAIL, PROBE_PASS, needs_repeat, plan
from opdflow.study.results import Claim, RunResult, StudyResults, arm_verdict, rl_breaks
from opdflow.testbed.tiny import worked


@pytest.mark.parametrize("quick", [False, True])
def test_every_arm_is_a_valid_pipeline_config(quick):
    scale, arms = plan(quick)
    assert arms[0].is_standard and len({a.name for a in arms}) == len(arms)
    for arm in arms:
        parse_recipe(arm.recipe)
        for seed in arm.seeds:
            cfg = apply_overrides(worked(), arm.overrides(scale, seed))
            assert cfg.train.steps == scale.steps and cfg.train.loss == arm.loss
            assert cfg.train.is_clip == 0  # the paper's objective, whatever the base sets
            assert cfg.staleness.k == arm.k and cfg.engine.recipe == arm.recipe


def test_the_full_plan_covers_the_issue_ladder():
    _, arms = plan(quick=False)
    ladder = {(a.recipe, a.k) for a in arms if a.experiment == "ladder"}
    for want in [
        ("bf16", 0),
        ("fp8", 0),
        ("fp8(bf16_layers=[0,-1])", 0),
        ("fp8_kv", 0),
        ("fp8_kv(kv_bf16_layers=[0])", 0),
        ("nvfp4", 0),
        *((("bf16", k)) for k in (1, 2, 4, 8)),
        ("fp8", 4),
    ]:
        assert want in ladder, want
    assert sum(r.startswith("noise") for r, _ in ladder) >= 4
    rl = {(a.loss, a.center) for a in arms if a.experiment == "rl"}
    assert rl == {("reinforce", False), ("reinforce", True), ("grpo", False), ("grpo", True)}
    assert any(a.experiment == "centering" and a.loss == "opd" for a in arms)
    std = next(a for a in arms if a.is_standard)
    assert len(std.seeds) >= 2  # every repeated arm needs the standard at its seed


def test_a_verdict_near_tau_gets_a_second_seed():
    assert not needs_repeat({"delta": 0.02, "fails": False}, 0.2)
    assert needs_repeat({"delta": 0.12, "fails": False}, 0.2)
    assert needs_repeat({"delta": 0.30, "fails": True}, 0.2)
    assert needs_repeat({"delta": 0.9, "fails": False}, 0.2)  # interval straddles zero
    assert not needs_repeat({"delta": 0.9, "fails": True}, 0.2)


def _run(arm="opd bf16", seed=0, d=0.01, verdict=None, **kw) -> RunResult:
    base = dict(
        experiment="ladder",
        recipe="bf16",
        k=0,
        loss="opd",
        center=False,
        lr=2e-4,
        path="",
        seconds=60.0,
        d_engine=d,
        d_engine_exact=d,
        d_stale=0.0,
        kl_start=0.8,
        kl_final=0.6,
        acc_final=0.5,
        entropy=0.3,
        length=4.0,
        reward=0.4,
    )
    base.update(kw)
    return RunResult(arm=arm, seed=seed, d=d, verdict=verdict, **base)


def _verdict(delta, fails, acc=0.0, acc_high=0.01):
    return {
        "delta": delta,
        "fails": fails,
        "decision": "FAIL" if fails else "PASS",
        "diff": {"estimate": 0.0, "low": -0.1, "high": 0.1},
        "acc_diff": {"estimate": acc, "low": acc - 0.05, "high": acc_high},
    }


def test_seeds_that_disagree_make_a_split_verdict():
    assert (
        arm_verdict([_run(verdict=_verdict(0.3, True)), _run(verdict=_verdict(0.1, False))])
        == "SPLIT"
    )
    assert arm_verdict([_run(verdict=_verdict(0.3, True))] * 2) == "FAIL"
    assert arm_verdict([_run()]) == "-"  # the standard run judges, it is not judged


def test_rl_breaks_on_accuracy_loss_or_collapse_only():
    base = _run(loss="grpo", experiment="rl")
    ok = _run(loss="grpo", experiment="rl", entropy=0.25)
    assert not rl_breaks(ok, base, _verdict(0.0, False, acc=-0.02, acc_high=0.01))
    assert rl_breaks(ok, base, _verdict(0.0, False, acc=-0.08, acc_high=-0.02))
    # a large drop whose interval reaches zero is not a break
    assert not rl_breaks(ok, base, _verdict(0.0, False, acc=-0.08, acc_high=0.01))
    collapsed = _run(loss="grpo", experiment="rl", entropy=0.1)
    assert rl_breaks(collapsed, base, _verdict(0.0, False))
    short = _run(loss="grpo", experiment="rl", length=1.5)
    assert rl_breaks(short, base, _verdict(0.0, False))


def test_claims_from_hand_made_results():
    runs = [
        _run("opd bf16", d=1e-5),
        _run("opd noise(1)", recipe="noise(1)", d=0.5, verdict=_verdict(0.05, False)),
        _run("opd noise(4)", recipe="noise(4)", d=2.0, verdict=_verdict(0.6, True)),
        _run("opd bf16 k=8", k=8, d=0.004, d_stale=0.004, verdict=_verdict(0.0, False)),
        _run("opd fp8_kv", recipe="fp8_kv", d=0.01, verdict=_verdict(0.0, False)),
        _run("grpo bf16", loss="grpo", experiment="rl"),
        _run("grpo noise(1)", recipe="noise(1)", loss="grpo", experiment="rl", d=0.5),
    ]
    runs[-1].breaks = True
    grad = [
        dict(
            recipe=PROBE_PASS,
            student="untrained",
            prefix_shift=1.0,
            per_token=1.0,
            update=2.0,
            total=1.5,
            total_ratio=0.75,
            prefix_shift_ratio=0.5,
            floor=0.1,
        ),
        dict(
            recipe=PROBE_FAIL,
            student="untrained",
            prefix_shift=5.0,
            per_token=2.0,
            update=2.0,
            total=6.0,
            total_ratio=3.0,
            prefix_shift_ratio=2.5,
            floor=0.1,
        ),
        dict(
            recipe=PROBE_PASS,
            student="step 120",
            prefix_shift=1.0,
            per_token=1.0,
            update=1.0,
            total=1.5,
            total_ratio=1.5,
            prefix_shift_ratio=1.0,
            floor=0.1,
        ),
    ]
    res = StudyResults(scale={}, tau=0.2, runs=runs, gradient=grad)
    from opdflow.study.results import bracket_of

    res.bracket = bracket_of(runs)
    assert res.bracket["largest_pass"] == 0.5 and res.bracket["smallest_fail"] == 2.0
    got = {(c.number, c.finding.split()[0]): c for c in claims(res)}
    assert got[(1, "OPD")].holds  # passes at 0.5 = 50,000x the standard engine's 1e-5
    assert got[(2, "Staleness")].holds  # k = 8: d_stale 0.004 < fp8_kv d_engine 0.01
    assert got[(3, "GRPO")].holds  # GRPO broke on noise(1), where OPD passes
    assert got[(5, "Prefix-shift")].holds  # 5x vs 2x
    assert got[(7, "Late")].holds  # 0.75 -> 1.5
    assert all(isinstance(c, Claim) and c.found for c in got.values())
    assert math.isclose(res.bracket["line"], 1.0)
    # results.json round trip
    again = StudyResults.from_dict(res.to_dict())
    assert again.runs[-1].breaks and again.bracket == res.bracket


def test_a_finished_run_made_with_another_config_is_never_overwritten(tmp_path):
    import json

    from rich.console import Console

    from opdflow.driver.session import Session
    from opdflow.errors import ConfigError
    from opdflow.study.runner import train_one

    scale, arms = plan(quick=True)
    d = tmp_path / "runs" / f"{arms[0].slug}-seed0"
    d.mkdir(parents=True)
    other = apply_overrides(PipelineConfig(), [*arms[0].overrides(scale, 0), "train.lr=1e-3"])
    (d / "config.json").write_text(json.dumps(other.to_dict()))
    (d / "summary.json").write_text(json.dumps({"steps": 3}))
    session = Session()
    with pytest.raises(ConfigError, match="another config"):
        train_one(session, scale, arms[0], 0, tmp_path, (), Console(quiet=True), "[1/1]")
    assert json.loads((d / "config.json").read_text())["train"]["lr"] == 1e-3
    assert json.loads((d / "summary.json").read_text()) == {"steps": 3}
    assert not session.connected  # refused before Ray


def test_each_run_is_judged_against_the_standard_of_its_own_learning_rate(monkeypatch):
    import opdflow.study.results as study
    from opdflow.study.results import judge_all

    runs = [
        _run("opd bf16", path="std"),
        _run("opd bf16 lr/10", path="std-slow", lr=2e-5, experiment="staleness-lr"),
        _run("opd bf16 k=8 lr/10", path="k8-slow", k=8, lr=2e-5, experiment="staleness-lr"),
        _run("opd+center bf16", path="centered", center=True, experiment="centering"),
        _run("grpo bf16", path="grpo", loss="grpo", experiment="rl"),
        _run("grpo noise(1)", path="grpo-noisy", recipe="noise(1)", loss="grpo", experiment="rl"),
    ]
    monkeypatch.setattr(study, "judge", lambda r, base, tau: {"base": base.path, **_verdict(0, 0)})
    judge_all(StudyResults(scale={}, tau=0.2, runs=runs), 0.2)
    base = {r.path: r.verdict and r.verdict["base"] for r in runs}
    assert base == {
        "std": None,
        "std-slow": None,  # the standard of its learning rate: it judges, it is not judged
        "k8-slow": "std-slow",
        "centered": "std",
        "grpo": None,
        "grpo-noisy": "grpo",
    }
