"""Mismatch measurement on the tiny model: estimators agree, recipes order as they should."""

import math

import pytest

from opdflow.analysis.measure import MeasureSession, measure_recipes, write_measurements
from opdflow.config import PipelineConfig


@pytest.fixture(scope="module")
def session(tiny):
    return MeasureSession(PipelineConfig(), num_prompts=32, responses_per_prompt=4)


def test_k1_and_k3_agree_with_exact_kl_within_the_bootstrap_interval(session):
    m = session.measure("noise(0.3)")
    assert m.tokens > 300 and m.prompts == 32 and m.responses_per_prompt == 4
    assert len(m.sum_k1_P) == 32 and sum(m.tokens_P) == m.tokens
    assert m.d_k1 == pytest.approx(sum(m.sum_k1_P) / m.tokens)
    assert m.ci_low < m.d_k1 < m.ci_high
    assert m.d_exact > 0.005
    assert m.ci_low <= m.d_exact <= m.ci_high
    assert m.ci_low <= m.d_k3 <= m.ci_high


def test_bf16_is_below_fp8_with_escapes_and_noise_is_monotone(session):
    bf16 = session.measure("bf16")
    fp8 = session.measure("fp8(bf16_layers=[0,-1])")
    assert 0 <= bf16.d_exact < fp8.d_exact
    sigmas = [0.05, 0.1, 0.2, 0.4]
    ds = [session.measure(f"noise({s})").d_exact for s in sigmas]
    assert ds == sorted(ds) and ds[0] > bf16.d_exact, ds
    assert ds[-1] > 5 * ds[0]


def test_measure_recipes_api_and_files(tiny, tmp_path):
    rows = measure_recipes(PipelineConfig(), ["bf16", "fp8_kv"], num_prompts=4)
    assert [r.recipe for r in rows] == ["bf16", "fp8_kv"]
    assert all(math.isfinite(r.d_exact) and r.seconds > 0 for r in rows)
    write_measurements(rows, str(tmp_path / "m.parquet"))
    write_measurements(rows, str(tmp_path / "m.json"))
    from opdflow.record.rundir import read_table

    assert [r["recipe"] for r in read_table(tmp_path / "m.parquet")] == ["bf16", "fp8_kv"]
