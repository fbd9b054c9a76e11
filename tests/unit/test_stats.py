import numpy as np

from opdflow.core.stats import paired_diff_ci, pooled_ratio_ci


def test_pooled_ratio_interval_contains_the_estimate_and_shrinks_with_data():
    rng = np.random.default_rng(0)
    counts = rng.integers(3, 9, size=200)
    sums = counts * 0.5 + rng.normal(0, 0.3, size=200) * np.sqrt(counts)
    wide = pooled_ratio_ci(sums[:20], counts[:20])
    narrow = pooled_ratio_ci(sums, counts)
    assert narrow.low <= narrow.estimate <= narrow.high
    assert narrow.high - narrow.low < wide.high - wide.low
    assert narrow.low < 0.5 < narrow.high


def test_paired_interval_covers_a_known_difference_at_about_the_nominal_rate():
    covered = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        counts = rng.integers(3, 9, size=64)
        base = rng.gamma(2.0, 1.0, size=64)  # per-prompt difficulty shared by both runs
        a = counts * (base + 0.2 + rng.normal(0, 0.3, 64))
        b = counts * (base + rng.normal(0, 0.3, 64))
        ci = paired_diff_ci(a, counts, b, counts, n_boot=500, seed=seed)
        true = 0.2  # pooled difference in expectation
        covered += ci.low <= true <= ci.high
    assert covered >= 88
