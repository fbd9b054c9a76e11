"""The adaptive staleness policy: the smallest k that keeps the trainer busy, inside a budget.

Asynchrony pays until the trainer is the bottleneck (docs/DESIGN.md, "The study"): past that knee a
larger k only adds staleness. AdaptiveStaleness finds the knee from what each learner
step cost (StepObservation), with no Ray and no clock of its own, so a simulation can
drive it step by step. The rules, in order of precedence:

1. Budget (safety, immediate): the mean d_stale measured at staleness s (recent steps)
   above `budget_nats` bans every k >= s; k drops below the ban at once.
2. Raise: after max(2, window // 2) settled steps at this k (then over the last `window`
   settled steps), or after 2 when the wait share is over `QUICK` times the target (no
   noise hides a trainer idle for a third of every step, and each such step is lost
   throughput), a trainer wait share above `target_wait_share` raises k: to the k that would hide the measured generation
   latency (`_k_needed`), at least by one, unless k is at k_max or the predicted d_stale at
   k + 1 (the worst measured d_stale per staleness step, times k + 1) breaks the budget;
   then it asks for more generator replicas instead (at most once per window).
3. Lower: a wait share under half the target for 4 * window settled steps tries k - 1;
   the probe is undone like any raise, or holds after a full window. Raising is quick
   (a k too high costs only staleness), lowering slow (a probe costs waits and the
   batches that break the lower bound are regenerated). Every
   raise past a k (measured or estimated too small) makes the next probe of that k wait
   four times as long (exponential backoff): this is the hysteresis; in a stationary
   regime probes die out.

"Settled" steps start `k + 1` steps after a change, once the batches launched under the
old k have been trained. Every change is a Decision with its reason.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from opdflow.core.staleness import Decision, StalenessPolicy, StepObservation


@dataclass
class _Level:
    """Recent d_stale measured at one staleness level."""

    values: deque = field(default_factory=lambda: deque(maxlen=16))

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else float("nan")


class AdaptiveStaleness(StalenessPolicy):
    """Chooses k in [0, k_max] from the trainer's wait share and the d_stale budget."""

    QUICK = 5.0  # a wait share this many times the target raises k after 2 settled steps

    def __init__(
        self,
        k_max: int,
        target_wait_share: float = 0.02,
        budget_nats: float = 0.0,
        start_k: int = 0,
        window: int = 8,
    ):
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max}")
        if not 0.0 < target_wait_share < 1.0:
            raise ValueError(f"target_wait_share must be in (0, 1), got {target_wait_share}")
        if budget_nats < 0:
            raise ValueError(f"budget_nats must be >= 0 (0 = no budget), got {budget_nats}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.k_max = k_max
        self.target = target_wait_share
        self.budget = budget_nats
        self.window = window
        self._k = min(max(start_k, 0), k_max)
        self._since_change = 0  # observations since the last change of k
        self._recent: deque[tuple[float, float]] = deque(maxlen=2 * window)  # (wait_s, step_s)
        self._levels: dict[int, _Level] = {}
        self._backoff: dict[int, int] = {}  # k -> failed probes of k (lowering to it)
        self._probe: int | None = None  # k we lowered to and are still testing
        self._last_ask = -(10**9)
        self._ban = k_max + 1  # smallest k that breaks the budget (k_max + 1: none)

    @classmethod
    def from_config(cls, cfg) -> AdaptiveStaleness:
        """From a StalenessConfig: k is the starting k."""
        return cls(cfg.k_max, cfg.target_wait_share, cfg.budget_nats, start_k=cfg.k)

    @property
    def k(self) -> int:
        return self._k

    # ------------------------------------------------------------------ measurements

    def _settle(self) -> int:
        return self._k + 1

    def _settled(self) -> list[tuple[float, float]]:
        n = max(0, self._since_change - self._settle())
        return list(self._recent)[-n:] if n else []

    @staticmethod
    def _share(obs: list[tuple[float, float]]) -> float:
        total = sum(s for _, s in obs)
        return sum(w for w, _ in obs) / total if total > 0 else 0.0

    def _k_needed(self, obs: list[tuple[float, float]]) -> int:
        """k that would hide the generation latency if generation is latency-bound.

        Waiting at k, the step period is P = (L + t) / (k + 1) for a generation latency
        L and a training time t; hiding L needs k >= L / t = (k + 1) P / t - 1.
        """
        period = sum(s for _, s in obs) / len(obs)
        busy = period - sum(w for w, _ in obs) / len(obs)
        if busy <= 0:
            return self.k_max
        return math.ceil((self._k + 1) * period / busy - 1 - 1e-9)

    def d_stale_per_step(self) -> float:
        """Worst measured d_stale per unit of staleness (0 before any stale batch)."""
        slopes = [max(lv.mean, 0.0) / s for s, lv in self._levels.items() if s > 0 and lv.values]
        return max(slopes, default=0.0)

    def predicted_d_stale(self, k: int) -> float:
        return self.d_stale_per_step() * k

    def _budget_allows(self, k: int) -> bool:
        if k >= self._ban:
            return False
        return self.budget <= 0 or self.predicted_d_stale(k) <= self.budget

    # ------------------------------------------------------------------ the policy

    def _change(self, step: int, new_k: int, reason: str) -> Decision:
        old, self._k = self._k, new_k
        self._since_change = 0
        return Decision(step, old, new_k, reason)

    def observe(self, obs: StepObservation) -> Decision | None:
        self._since_change += 1
        self._recent.append((max(obs.trainer_wait_s, 0.0), max(obs.step_s, 1e-9)))
        if obs.staleness > 0 and math.isfinite(obs.d_stale):
            self._levels.setdefault(obs.staleness, _Level()).values.append(obs.d_stale)
        # 1. budget
        if self.budget > 0:
            for s, lv in sorted(self._levels.items()):
                if s > 0 and lv.values and lv.mean > self.budget and s < self._ban:
                    self._ban = s
            if self._k >= self._ban:
                return self._change(
                    obs.step,
                    self._ban - 1,
                    f"d_stale {self._levels[self._ban].mean:.3g} nats at staleness {self._ban} "
                    f"> budget {self.budget:.3g}: k capped at {self._ban - 1}",
                )
        settled = self._settled()
        probing = self._probe == self._k
        if len(settled) < 2 or (
            len(settled) < self.window // 2 and self._share(settled) <= self.QUICK * self.target
        ):
            return None
        n = min(len(settled), self.window)  # a quick first look, then a full window
        share = self._share(settled[-n:])
        # 2. raise
        if share > self.target:
            self._probe = None
            if self._k < self.k_max and self._budget_allows(self._k + 1):
                new_k = self._k + 1
                if self.budget <= 0 or self.d_stale_per_step() > 0:  # jump only when it is safe
                    needed = min(self.k_max, self._k_needed(settled))
                    while new_k < needed and self._budget_allows(new_k + 1):
                        new_k += 1
                for level in range(self._k, new_k):  # measured or estimated too small
                    self._backoff[level] = self._backoff.get(level, 0) + 1
                return self._change(
                    obs.step,
                    new_k,
                    f"trainer wait share {share:.1%} > target {self.target:.1%} over "
                    f"{n} steps: raise k",
                )
            if obs.step - self._last_ask >= self.window:
                self._last_ask = obs.step
                why = (
                    f"k_max={self.k_max}"
                    if self._k >= self.k_max
                    else f"budget {self.budget:.3g} nats (predicted "
                    f"{self.predicted_d_stale(self._k + 1):.3g} at k={self._k + 1})"
                )
                return Decision(
                    obs.step,
                    self._k,
                    self._k,
                    f"trainer wait share {share:.1%} > target {self.target:.1%} at {why}: "
                    "more generator replicas needed",
                    want_more_generators=True,
                )
            return None
        # 3. lower
        if probing:
            if len(settled) < self.window:
                return None
            self._probe = None  # the probe held for a full window: this k is enough
            self._backoff.pop(self._k, None)
        need = 4 * self.window * 4 ** self._backoff.get(self._k - 1, 0)
        if (
            self._k > 0
            and self._since_change - self._settle() >= need
            and self._share(settled) < self.target / 2
        ):
            self._probe = self._k - 1
            return self._change(
                obs.step,
                self._k - 1,
                f"trainer wait share {self._share(settled):.1%} < {self.target / 2:.1%} for "
                f"{need} steps: try lower k",
            )
        return None

    # ------------------------------------------------------------------ persistence

    def state(self) -> dict:
        return {
            "k": self._k,
            "since_change": self._since_change,
            "recent": [list(x) for x in self._recent],
            "levels": {str(s): list(lv.values) for s, lv in self._levels.items()},
            "backoff": {str(k): n for k, n in self._backoff.items()},
            "probe": self._probe,
            "last_ask": self._last_ask,
            "ban": self._ban,
        }

    def load_state(self, state: dict) -> None:
        self._k = int(state["k"])
        self._since_change = int(state["since_change"])
        self._recent = deque((tuple(x) for x in state["recent"]), maxlen=2 * self.window)
        self._levels = {int(s): _Level(deque(v, maxlen=16)) for s, v in state["levels"].items()}
        self._backoff = {int(k): int(n) for k, n in state["backoff"].items()}
        self._probe = state["probe"]
        self._last_ask = int(state["last_ask"])
        self._ban = int(state["ban"])
