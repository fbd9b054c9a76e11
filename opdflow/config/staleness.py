"""The staleness bound k: how many versions behind the learner a rollout's weights may be."""

from __future__ import annotations

from dataclasses import dataclass

from opdflow.config.rules import fail, nonnegative, one_of


@dataclass
class StalenessConfig:
    """How many versions old rollout weights may be: step n trains on version v iff n - v <= k."""

    policy: str = "fixed"
    """"fixed" (k below) or "adaptive" (tunes k in [0, k_max] to keep the trainer busy)."""
    k: int = 2
    """Fixed staleness bound; 0 = synchronous. The adaptive policy's starting k."""
    k_max: int = 8
    """Adaptive policy: largest k it may choose."""
    target_wait_share: float = 0.02
    """Adaptive policy: trainer wait as a share of step time it aims to stay under."""
    budget_nats: float = 0.0
    """Adaptive policy: d_stale (nats/token) it may never exceed; 0 = no budget."""

    def validate(self, path: str) -> None:
        one_of(f"{path}.policy", self.policy, ("fixed", "adaptive"))
        nonnegative(f"{path}.k", self.k)
        nonnegative(f"{path}.k_max", self.k_max)
        if self.policy == "adaptive" and self.k > self.k_max:
            fail(f"{path}.k", self.k, f"at most k_max={self.k_max}")
        if not 0.0 < self.target_wait_share < 1.0:
            fail(f"{path}.target_wait_share", self.target_wait_share, "a share in (0, 1)")
        nonnegative(f"{path}.budget_nats", self.budget_nats)
