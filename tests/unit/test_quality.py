"""The quality rule and budget calibration on constructed run directories (real RunDir writer)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from opdflow.analysis.calibration import RunPoint, crossing_line, derive_bracket, points_from_runs
from opdflow.analysis.quality import compare_runs, load_run
from opdflow.cli import main
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.core.stats import paired_diff_ci
from opdflow.errors import ConfigError
from opdflow.record.rundir import RunDir

TOKENS = 20


def make_run(tmp_path, name, kl_P, *, recipe="bf16", d=0.001, acc_P=None, final=10, sets=()):
    """A finished run: held-out rows at versions 0 and `final`, metrics with mismatch d."""
    cfg = apply_overrides(PipelineConfig(name="t"), [f"engine.recipe={recipe}", *sets])
    run = RunDir.create(cfg, tmp_path / name)
    acc_P = acc_P if acc_P is not None else [0.5] * len(kl_P)
    for version, kls in ((0, [3.0] * len(kl_P)), (final, kl_P)):
        run.add_heldout(
            [
                {
                    "version": version,
                    "prompt_index": i,
                    "kl_sum": k * TOKENS,
                    "tokens": TOKENS,
                    "kl": k,
                    "accuracy": a,
                }
                for i, (k, a) in enumerate(zip(kls, acc_P))
            ]
        )
    for step in range(final):
        run.add_metrics(
            {"step": step, "tokens": 100, "d_engine_k1": d, "d_total_k1": d, "step_s": 0.5}
        )
    return run.path


BASE = [1.0 + 0.5 * math.sin(i) for i in range(32)]


def _scaled(factor, noise=0.0):
    return [b * factor + noise * (-1) ** i for i, b in enumerate(BASE)]


# ---------------------------------------------------------------- bootstrap coverage


def test_paired_bootstrap_interval_covers_a_known_difference():
    # Per-prompt tokens independent of KL, so the pooled difference's truth is E[kl_c - kl_std].
    true_diff, covered, seeds = 0.10, 0, 200
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        P = 64
        tok = rng.integers(5, 40, P).astype(float)
        kl_std = rng.gamma(4.0, 0.25, P)  # mean 1.0
        kl_c = kl_std + true_diff + rng.normal(0, 0.3, P)
        ci = paired_diff_ci(kl_c * tok, tok, kl_std * tok, tok, n_boot=1000, seed=seed)
        covered += ci.low <= true_diff <= ci.high
    assert covered / seeds >= 0.90, covered


# ---------------------------------------------------------------- the rule at its boundaries


@pytest.mark.parametrize(
    ("factor", "noise", "tau", "decision"),
    [
        (1.199, 0.0, 0.20, "PASS"),  # Delta just below tau, interval excludes zero
        (1.201, 0.0, 0.20, "FAIL"),  # just above tau, interval excludes zero
        (1.25, 0.0, 0.25, "FAIL"),  # Delta == tau fails (>=)
        (1.30, 1.9, 0.20, "PASS"),  # Delta above tau but the interval includes zero
        (0.90, 0.0, 0.20, "PASS"),  # better than standard
    ],
)
def test_rule_at_the_boundaries(tmp_path, factor, noise, tau, decision):
    std = make_run(tmp_path, "std", BASE)
    c = make_run(tmp_path, "c", _scaled(factor, noise), recipe="noise(0.5)")
    v = compare_runs(load_run(std), load_run(c), tau=tau)
    assert v.delta == pytest.approx(factor - 1, abs=1e-9)
    assert v.decision == decision
    assert v.diff.excludes_zero() == (noise == 0.0)


def test_accuracy_rule(tmp_path):
    std = make_run(tmp_path, "std", BASE, acc_P=[0.75] * 32)
    worse = make_run(tmp_path, "w", BASE, acc_P=[0.5 + 0.25 * (i % 2) for i in range(32)])
    small = make_run(tmp_path, "s", BASE, acc_P=[0.75 - 0.25 * (i % 8 == 0) for i in range(32)])
    v = compare_runs(load_run(std), load_run(worse))
    assert v.acc_c == pytest.approx(0.625) and v.acc_worse  # 12.5 points lost, CI < 0
    v2 = compare_runs(load_run(std), load_run(small))  # 3.1 points lost: below acc_drop
    assert v2.acc_std - v2.acc_c == pytest.approx(0.25 / 8) and not v2.acc_worse
    v3 = compare_runs(load_run(std), load_run(std))
    assert not v3.acc_worse and v3.decision == "PASS"


# ---------------------------------------------------------------- refusing unpaired runs


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["eval.seed=7"], "eval.seed"),
        (["eval.prompts=16"], "eval.prompts"),
        (["eval.samples_per_prompt=2"], "eval.samples_per_prompt"),
        (["data.heldout=/data/other.parquet"], "data.heldout"),
        (["data.task.num_heldout=128"], "data.task"),
    ],
)
def test_refuses_runs_on_different_heldout_sets(tmp_path, sets, field):
    std = make_run(tmp_path, "std", BASE)
    c = make_run(tmp_path, "c", BASE, sets=sets)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        compare_runs(load_run(std), load_run(c))


def test_refuses_runs_without_a_common_final_version(tmp_path):
    std = make_run(tmp_path, "std", BASE, final=10)
    c = make_run(tmp_path, "c", BASE, final=8)
    with pytest.raises(ConfigError, match="common final held-out version"):
        compare_runs(load_run(std), load_run(c))
    # version 0 is common: it can be asked for explicitly
    assert compare_runs(load_run(std), load_run(c), version=0).delta == 0


def test_compare_cli_json_and_exit_codes(tmp_path):
    std = make_run(tmp_path, "std", BASE)
    bad = make_run(tmp_path, "bad", _scaled(1.5), recipe="noise(1.0)")
    r = CliRunner().invoke(main, ["compare", str(std), str(bad), "--json"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.output)
    assert out["decision"] == "FAIL" and out["recipe"] == "noise(1.0)"
    assert out["delta"] == pytest.approx(0.5) and out["diff"]["low"] > 0
    r = CliRunner().invoke(main, ["compare", str(std), str(std)])
    assert r.exit_code == 0 and "PASS" in r.output
    other = make_run(tmp_path, "other", BASE, sets=["eval.seed=9"])
    r = CliRunner().invoke(main, ["compare", str(std), str(other)])
    assert r.exit_code == 2 and "eval.seed: 1234 vs 9" in r.output


# ---------------------------------------------------------------- calibration


def _point(d, fails, delta=0.0):
    return RunPoint("r", "x", d, d, delta, 0.0, 0.0, fails)


def test_bracket_and_line():
    b = derive_bracket(
        [_point(0.001, False), _point(0.1, False), _point(0.4, True), _point(0.9, True)]
    )
    assert b.status == "bracket" and (b.largest_pass, b.smallest_fail) == (0.1, 0.4)
    assert b.line == pytest.approx(0.2)  # geometric mean


@pytest.mark.parametrize(
    ("points", "status"),
    [
        ([_point(0.001, False), _point(0.3, False)], "all_pass"),
        ([_point(0.3, True), _point(0.5, True)], "all_fail"),
        ([_point(0.001, False), _point(0.6, False), _point(0.5, True)], "overlap"),
        ([], "empty"),
    ],
)
def test_runs_that_do_not_bracket_give_no_line(points, status):
    b = derive_bracket(points)
    assert b.status == status and b.line is None
    assert "no line" in b.message or status == "empty"


def test_crossing_line_interpolates_in_log_d():
    pts = [_point(0.01, False, 0.0), _point(0.1, False, 0.1), _point(1.0, True, 0.3)]
    line, _ = crossing_line(pts, 0.2)
    assert line == pytest.approx(math.sqrt(0.1))  # halfway between 0.1 and 1 in log D
    assert crossing_line(pts[:2], 0.2)[0] is None
    zigzag = [_point(0.01, False, 0.0), _point(0.1, True, 0.6), _point(0.5, False, 0.0)]
    line, msg = crossing_line([*zigzag, _point(1.0, True, 0.3)], 0.2)
    assert line is None and "3 times" in msg


def test_calibrate_cli_from_constructed_runs(tmp_path):
    std = make_run(tmp_path, "std", BASE, d=0.001)
    ok = make_run(tmp_path, "ok", _scaled(1.05), recipe="noise(0.5)", d=0.1)
    bad = make_run(tmp_path, "bad", _scaled(1.4), recipe="noise(1.0)", d=0.4)
    pts = points_from_runs(std, [ok, bad], 0.2)
    assert [p.fails for p in pts] == [False, False, True]
    assert [p.d for p in pts] == pytest.approx([0.001, 0.1, 0.4])
    out = tmp_path / "budget.json"
    r = CliRunner().invoke(
        main, ["calibrate", str(ok), str(bad), "--std", str(std), "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    budget = json.loads(out.read_text())
    assert budget["line_nats"] == pytest.approx(0.2) and budget["bracket"] == [0.1, 0.4]
    assert budget["step_s_per_response"] == pytest.approx(0.5 / 64)
    from opdflow.analysis.admission import load_budget

    assert load_budget(out).line == pytest.approx(0.2)
    # all pass: says so, writes nothing, exit 1
    r = CliRunner().invoke(
        main, ["calibrate", str(ok), "--std", str(std), "--out", str(tmp_path / "x.json")]
    )
    assert r.exit_code == 1 and "every run passes" in r.output
    assert not (tmp_path / "x.json").exists()
