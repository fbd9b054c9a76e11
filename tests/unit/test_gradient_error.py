"""The gradient error of one OPD update under a mismatched engine, split in two parts: a
BF16 engine against itself shifts no prefix, and the parts obey the triangle inequality."""

import pytest

from opdflow.analysis.gradient_error import GradientProbe
from opdflow.config import PipelineConfig


@pytest.fixture(scope="module")
def probe(tiny):
    return GradientProbe(PipelineConfig(), prompts=4, responses_per_prompt=2)


def test_the_bf16_engine_shifts_no_prefix_and_its_error_is_the_per_token_part(probe):
    e = probe.errors("bf16")  # the reference engine, the same seed: the same tokens
    assert e.prefix_shift == 0.0 and e.total == e.per_token
    assert e.update > 0 and e.floor > 0 and e.responses == 4 * 2


def test_a_noisy_engine_shifts_prefixes_and_the_parts_bound_the_total(probe):
    e = probe.errors("noise(1.0)")
    assert e.prefix_shift > 0 and e.per_token > 0
    assert e.total <= (e.prefix_shift + e.per_token) * (1 + 1e-6)  # |a + b| <= |a| + |b|
    assert e.ratio("total") == e.total / e.update
