"""What a replay after a learner's rewind must reproduce at k = 0 (tests of healing)."""

from __future__ import annotations

import pytest

SAME_BATCH = ("step", "version", "staleness", "tokens", "responses", "skipped")
"""Equal: the replayed step trained the same batch (same prompts, seeds, sampled tokens)."""
FP32 = ("loss", "train_kl", "grad_norm")
"""The learner's FP32 numbers: equal within float tolerance (gradients may be summed in
another order: another number of ranks)."""
ON_BF16 = ("d_stale_k1", "d_total_k1", "d_engine_k1")
"""Differences of log-probabilities under BF16 weights, themselves 1e-5..1e-3 nats/token:
an FP32 weight that differs in its last bits can round to the neighbouring BF16 value, which
moves them by up to ~1e-4 (a wrong weights version moves them by the step's update)."""


def assert_replayed(full: list[dict], replayed: list[dict]) -> None:
    """`replayed` (a healed run's metrics rows) trains what the uninterrupted `full` did."""
    assert len(full) == len(replayed)
    for a, b in zip(full, replayed):
        for key in SAME_BATCH:
            assert a[key] == b[key], (a["step"], key)
        for key in FP32:
            assert b[key] == pytest.approx(a[key], rel=1e-4), (a["step"], key)
        for key in ON_BF16:
            assert b[key] == pytest.approx(a[key], abs=1e-4), (a["step"], key)
