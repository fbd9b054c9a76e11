"""Admission decisions, budget files, full-run estimates and drift (pure logic, no models)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from opdflow.analysis.admission import PILOT_LINE, Budget, admits, decide, drift_report, load_budget
from opdflow.config import PipelineConfig
from opdflow.errors import ConfigError


def _m(recipe, d, low, high, seconds=4.0):
    """The fields of an opdflow.analysis.measure.Measurement that a decision reads."""
    return SimpleNamespace(
        recipe=recipe, d_k1=d, ci_low=low, ci_high=high, seconds=seconds, tokens=300,
        prompts=16, responses_per_prompt=2,
    )  # fmt: skip


def test_rule_admit_iff_alpha_times_d_hat_within_line():
    assert admits(0.25, 0.375, 1.5)  # 0.375 <= 0.375 (equality admits)
    assert not admits(0.2501, 0.375, 1.5)
    assert admits(0.0008, PILOT_LINE)


def test_budget_sources(tmp_path):
    assert load_budget().line == PILOT_LINE and "pilot" in load_budget().source
    assert load_budget(line=0.2).line == 0.2
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"line_nats": 0.25, "method": "runs", "step_s_per_response": 0.01}))
    b = load_budget(f)
    assert (b.line, b.step_s_per_response) == (0.25, 0.01) and str(f) in b.source
    f.write_text(json.dumps({"line_nats": None}))
    with pytest.raises(ConfigError, match="line_nats"):
        load_budget(f)
    with pytest.raises(ConfigError, match="not found"):
        load_budget(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="not both"):
        load_budget(f, 0.2)


def test_decisions_and_full_run_estimate():
    cfg = PipelineConfig()  # 40 steps x 8 prompts x 8 responses
    budget = load_budget(line=0.3)
    ok = decide(cfg, _m("bf16", 0.001, 0.0005, 0.002), budget)
    assert ok.admit and not ok.borderline and ok.decision == "ADMIT"
    # no measured step cost: generation + rescoring per response from the check (rough)
    assert ok.full_run_is_rough and ok.full_run_s == pytest.approx(40 * 64 * 4.0 / 32)
    bad = decide(cfg, _m("noise(1.0)", 0.6, 0.5, 0.7), budget)
    assert not bad.admit and bad.decision == "REJECT"
    edge = decide(cfg, _m("fp8", 0.19, 0.15, 0.25), budget)  # boundary 0.2 inside the CI
    assert edge.admit and edge.borderline
    calibrated = decide(cfg, _m("bf16", 0.001, 0, 0.002), Budget(0.3, "test", 0.05))
    assert not calibrated.full_run_is_rough
    assert calibrated.full_run_s == pytest.approx(40 * 64 * 0.05)
    against = decide(cfg, _m("bf16", 0.001, 0, 0.002), Budget(0.3, "test", 0.05), 1.5, 0.01)
    assert against.full_run_s == pytest.approx(40 * 64 * 0.01)  # a finished run's speed wins


def test_drift_ratio_flags_engines_past_the_margin():
    # online d_engine grows from 1x to 2x the offline estimate over training
    rows = [
        {
            "step": s,
            "tokens": 100,
            "d_engine_k1": 0.1 * (1 + s / 9),
            "d_total_k1": 0.1 * (1 + s / 9) + 0.01,
        }
        for s in range(10)
    ]
    w = drift_report(rows, d_hat=0.1, alpha=1.5, windows=2)
    assert len(w) == 3  # two windows and all steps
    assert w[0].ratio_engine == pytest.approx(1 + 2 / 9) and not w[0].past_margin
    assert w[1].ratio_engine == pytest.approx(1 + 7 / 9) and w[1].past_margin
    assert w[2].ratio_engine == pytest.approx(1.5) and not w[2].past_margin  # 1.5 is not > 1.5
    assert w[2].ratio_total == pytest.approx(1.6)
    with pytest.raises(ConfigError):
        drift_report([], 0.1)
