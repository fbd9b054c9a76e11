"""Response lengths for the simulator: the run's own, or a Pareto tail of the same mean.

A generator chunk runs until its longest response ends, so what matters is the longest of
n draws: `expected_longest` gives its mean, which turns a measured chunk time into a rate
per response-token of the longest response (simulator's dataflow.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from opdflow.analysis.stage_times import StageTimes
from opdflow.errors import ConfigError


@dataclass(frozen=True)
class LengthModel:
    """Response lengths in tokens: "empirical" (the run's) or "pareto:ALPHA[:CAP]".

    The Pareto tail keeps the run's mean length and is capped at CAP tokens (default
    max_new_tokens); a smaller ALPHA (> 1) means a heavier tail: a few responses far longer
    than the rest, which hold their whole chunk.
    """

    spec: str
    samples: np.ndarray
    cap: float

    @classmethod
    def parse(cls, spec: str, times: StageTimes) -> LengthModel:
        parts = spec.strip().split(":")
        if parts[0] == "empirical" and len(parts) == 1:
            return cls("empirical", times.response_lengths, float(times.max_new_tokens))
        try:
            if parts[0] != "pareto" or len(parts) not in (2, 3):
                raise ValueError
            alpha = float(parts[1])
            cap = float(parts[2]) if len(parts) == 3 else float(times.max_new_tokens)
            if not alpha > 1 or not cap >= 1:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"--tail {spec!r} is not allowed: expected 'empirical' or 'pareto:ALPHA[:CAP]' "
                "with ALPHA > 1 (tail heaviness) and CAP >= 1 tokens, e.g. pareto:1.5:64"
            ) from None
        mean = float(np.mean(times.response_lengths))
        xm = mean * (alpha - 1) / alpha
        rng = np.random.default_rng(12345)
        samples = np.clip(xm * (1 + rng.pareto(alpha, 20000)), 1.0, cap)
        return cls(spec, samples, cap)

    def draw(self, rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
        return rng.choice(self.samples, size=n) * scale

    def expected_longest(self, n: int) -> float:
        """Mean of the longest of n draws (scale 1), by quadrature over the sorted samples."""
        return _expected_max(self.samples.tobytes(), n)


@lru_cache(maxsize=256)
def _expected_max(buf: bytes, n: int) -> float:
    x = np.sort(np.frombuffer(buf, dtype=float))
    m = len(x)
    cdf = np.arange(1, m + 1) / m
    weights = cdf**n - np.concatenate([[0.0], cdf[:-1]]) ** n
    return float((weights * x).sum())
