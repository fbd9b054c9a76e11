import numpy as np
import pytest

from opdflow.core.mismatch import MismatchStats, exact_kl, k1, k3


def _dists(rng, n, v, scale):
    logits_q = rng.normal(size=(n, v))
    logits_p = logits_q + scale * rng.normal(size=(n, v))
    lq = logits_q - np.log(np.exp(logits_q).sum(-1, keepdims=True))
    lp = logits_p - np.log(np.exp(logits_p).sum(-1, keepdims=True))
    return lq, lp


@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0])
def test_k1_and_k3_on_samples_estimate_the_exact_kl(scale):
    rng = np.random.default_rng(0)
    lq, lp = _dists(rng, 64, 11, scale)
    reps = 400  # tokens sampled per prefix from q
    y = np.stack([rng.choice(11, size=reps, p=np.exp(row)) for row in lq])  # [64, reps]
    logp_q = np.take_along_axis(lq, y, 1)
    logp_p = np.take_along_axis(lp, y, 1)
    mask = np.ones_like(y, dtype=bool)
    exact = exact_kl(lq[:, None, :].repeat(reps, 1), lp[:, None, :].repeat(reps, 1), mask)
    assert exact > 0
    assert abs(k1(logp_q, logp_p, mask) - exact) < 0.1 * exact + 2e-4
    assert abs(k3(logp_q, logp_p, mask) - exact) < 0.1 * exact + 2e-4


def test_pooling_is_over_tokens_and_ignores_masked_positions():
    a = np.array([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    b = np.zeros_like(a)
    mask = np.array([[True, True, False], [True, False, False]])
    assert k1(a, b, mask) == pytest.approx(2.0)  # (1 + 2 + 3) / 3, not a mean of row means
    stats = MismatchStats.of(a, b, mask)
    assert stats.tokens == 3
    assert np.isnan(stats.exact)


def test_k3_is_nonnegative_and_zero_for_identical_logprobs():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(5, 7))
    mask = np.ones_like(a, dtype=bool)
    assert k3(a, a, mask) == 0.0
    assert k3(a, a + rng.normal(size=a.shape), mask) > 0


def test_exact_kl_of_identical_distributions_is_zero():
    rng = np.random.default_rng(2)
    lq, _ = _dists(rng, 4, 5, 0.0)
    assert exact_kl(lq[None], lq[None], np.ones((1, 4), bool)) == pytest.approx(0.0, abs=1e-12)
