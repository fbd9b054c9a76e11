"""Mismatch estimators in nats/token, token-pooled (sum over response tokens / count).

D = mean(logp_engine - logp_other) is the k1 estimate of KL(q || p) when tokens are
sampled from q at temperature 1; k3 = exp(-r) - 1 + r is its non-negative companion;
exact KL sums over the vocabulary at each visited prefix. Pure numpy, no Ray, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _pooled(values: np.ndarray, mask: np.ndarray) -> float:
    n = int(mask.sum())
    if n == 0:
        return float("nan")
    return float(np.where(mask, values, 0.0).sum(dtype=np.float64) / n)


def k1(logp_q: np.ndarray, logp_p: np.ndarray, mask: np.ndarray) -> float:
    """Token-pooled mean of log q - log p (unbiased KL(q || p) for tokens sampled from q)."""
    return _pooled(np.asarray(logp_q, np.float64) - np.asarray(logp_p, np.float64), mask)


def k3(logp_q: np.ndarray, logp_p: np.ndarray, mask: np.ndarray) -> float:
    """Token-pooled mean of exp(-r) - 1 + r with r = log q - log p (non-negative, unbiased)."""
    r = np.asarray(logp_q, np.float64) - np.asarray(logp_p, np.float64)
    r = np.clip(r, -50.0, 50.0)
    return _pooled(np.expm1(-r) + r, mask)


def exact_kl_per_token(logdist_q: np.ndarray, logdist_p: np.ndarray) -> np.ndarray:
    """KL(q || p) = sum_v q(v) (log q(v) - log p(v)) over the last axis.

    Both are renormalised in float64 first (float32 log-softmax sums to 1 only to ~1e-7), and
    the float64 rounding left is clipped, so identical distributions give 0, never -1e-9."""

    def renorm(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        top = np.max(x, axis=-1, keepdims=True)
        return x - (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))

    q, p = renorm(logdist_q), renorm(logdist_p)
    prob_q = np.exp(q)
    diff = np.where(prob_q > 0, q - p, 0.0)
    return np.maximum((prob_q * diff).sum(axis=-1), 0.0)


def exact_kl(logdist_q: np.ndarray, logdist_p: np.ndarray, mask: np.ndarray) -> float:
    """Token-pooled exact KL(q || p)."""
    return _pooled(exact_kl_per_token(logdist_q, logdist_p), mask)


@dataclass(frozen=True)
class MismatchStats:
    """The three estimates of one mismatch, nats/token, and the tokens they pool."""

    k1: float
    k3: float
    exact: float
    tokens: int

    @classmethod
    def of(
        cls,
        logp_q: np.ndarray,
        logp_p: np.ndarray,
        mask: np.ndarray,
        kl_exact_per_token: np.ndarray | None = None,
    ) -> MismatchStats:
        exact = (
            _pooled(kl_exact_per_token, mask) if kl_exact_per_token is not None else float("nan")
        )
        return cls(k1(logp_q, logp_p, mask), k3(logp_q, logp_p, mask), exact, int(mask.sum()))


def engine_mismatch(batch) -> MismatchStats:
    """d_engine of a rescored RolloutBatch: engine vs BF16 student at the same version."""
    return MismatchStats.of(
        batch.logp_engine_B_T,
        batch.logp_rescore_B_T,
        batch.response_mask_B_T,
        batch.kl_engine_exact_B_T,
    )
