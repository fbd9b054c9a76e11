"""Bootstrap intervals over prompts for token-pooled quantities (pure numpy).

Mismatch and held-out KL are token-pooled (sum over tokens / count), and prompts are the
independent units: intervals resample prompts with replacement and recompute the pooled
ratio. Paired intervals resample the same prompt indices for both runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float = 0.95

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def _check(sums: np.ndarray, counts: np.ndarray) -> None:
    if sums.shape != counts.shape or sums.ndim != 1 or sums.size == 0:
        raise ValueError(
            f"sums and counts must be equal-length non-empty vectors, got {sums.shape}, {counts.shape}"
        )


def pooled_ratio_ci(
    sums_P, counts_P, level: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> Interval:
    """sum(sums) / sum(counts) with a percentile interval from resampling prompts."""
    sums, counts = np.asarray(sums_P, float), np.asarray(counts_P, float)
    _check(sums, counts)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, sums.size, size=(n_boot, sums.size))
    boot = sums[idx].sum(1) / np.maximum(counts[idx].sum(1), 1e-12)
    alpha = (1 - level) / 2
    return Interval(
        float(sums.sum() / max(counts.sum(), 1e-12)),
        float(np.quantile(boot, alpha)),
        float(np.quantile(boot, 1 - alpha)),
        level,
    )


def paired_diff_ci(
    sums_a_P,
    counts_a_P,
    sums_b_P,
    counts_b_P,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> Interval:
    """pooled(a) - pooled(b) on the same prompts, resampling prompt indices jointly."""
    sa, ca = np.asarray(sums_a_P, float), np.asarray(counts_a_P, float)
    sb, cb = np.asarray(sums_b_P, float), np.asarray(counts_b_P, float)
    _check(sa, ca)
    _check(sb, cb)
    if sa.size != sb.size:
        raise ValueError(f"paired data needs the same prompts: {sa.size} vs {sb.size}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, sa.size, size=(n_boot, sa.size))
    boot = sa[idx].sum(1) / np.maximum(ca[idx].sum(1), 1e-12) - sb[idx].sum(1) / np.maximum(
        cb[idx].sum(1), 1e-12
    )
    alpha = (1 - level) / 2
    est = sa.sum() / max(ca.sum(), 1e-12) - sb.sum() / max(cb.sum(), 1e-12)
    return Interval(
        float(est), float(np.quantile(boot, alpha)), float(np.quantile(boot, 1 - alpha)), level
    )
