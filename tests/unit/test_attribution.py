"""Per-layer attribution finds the planted layer, and escaping it cuts D at least 10x."""

import pytest

from opdflow.analysis.attribution import attribute
from opdflow.analysis.measure import MeasureSession
from opdflow.config import PipelineConfig
from opdflow.config.loader import load_pipeline

pytestmark = pytest.mark.slow  # builds the planted tiny models once per cache (minutes)

PROMPTS = 8
"""Prompts per measurement: the planted layer moves D by orders of magnitude (its share
0.999, its escape 1,000x), so a few prompts separate every compared case."""


@pytest.fixture(scope="module")
def planted():
    cfg = load_pipeline("pipelines/tiny_cpu.py:planted")
    session = MeasureSession(cfg, num_prompts=PROMPTS, responses_per_prompt=4)
    return attribute(cfg, "fp8_kv", session=session)


@pytest.fixture(scope="module")
def unplanted(tiny):
    cfg = PipelineConfig()
    session = MeasureSession(cfg, num_prompts=PROMPTS, responses_per_prompt=4)
    return attribute(cfg, "fp8_kv", session=session)


def test_planted_layer_dominates_fp8_kv_mostly_through_keys(planted):
    shares = [row.share for row in planted.layers]
    assert shares[0] > 0.8, shares
    keys_only, values_only = planted.kv_split
    assert keys_only.recipe == "fp8_kv(keys_only=true)"
    assert keys_only.d > 3 * values_only.d
    assert keys_only.d > 0.5 * planted.full.d
    assert planted.bf16.d < 0.1 * planted.full.d


def test_keeping_layer_0_kv_in_bf16_cuts_d_tenfold(planted):
    escaped = planted.layers[0].all_but
    assert escaped.recipe == "fp8_kv(kv_bf16_layers=[0])"
    assert planted.full.d >= 10 * escaped.d, (planted.full.d, escaped.d)
    # the greedy escape search picks layer 0 first and reaches the default budget (D / 10)
    assert planted.escape_layers[0] == 0 and planted.reached


def test_unplanted_shares_are_flatter(planted, unplanted):
    assert max(r.share for r in unplanted.layers) < max(r.share for r in planted.layers)
    assert unplanted.full.d < planted.full.d
