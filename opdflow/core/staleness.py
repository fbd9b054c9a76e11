"""The staleness rule and the policy that sets k: pure code, no Ray.

A batch generated with weights version v may train step n only when n - v <= k; k = 0
is synchronous. The controller asks the policy for k before each launch and reports
what each step cost; a policy may change k (the adaptive one lives in adaptive.py). The
policy is the one object that answers what k is now, the largest k it may ever choose
(k_max) and so how many weight versions a run may hold (`live_versions`); policy.py
makes it from a StalenessConfig or a sweep's k, launch.py applies the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


def within_bound(step: int, version: int, k: int) -> bool:
    """True when a batch from weights `version` may train learner step `step` (0-based)."""
    return 0 <= step - version <= k


def launch_version(step: int, k: int, latest: int) -> int | None:
    """Weights version to generate step's batch with, or None if it must wait.

    The freshest published version is always used; generation may start only once
    version step - k exists.
    """
    if latest < step - k:
        return None
    return min(latest, step)


@dataclass(frozen=True)
class StepObservation:
    """What one learner step cost, reported to the policy after it finishes."""

    step: int
    trainer_wait_s: float
    step_s: float
    d_stale: float
    staleness: int


@dataclass(frozen=True)
class Decision:
    """A change of k with its reason (logged)."""

    step: int
    old_k: int
    new_k: int
    reason: str
    want_more_generators: bool = False


class StalenessPolicy(Protocol):
    """Sets k; `observe` may return a Decision when it changes k or asks for replicas."""

    k_max: int
    """The largest k this policy may ever choose."""

    @property
    def k(self) -> int:
        """The bound in effect now."""
        ...

    @property
    def live_versions(self) -> int:
        """Most weight versions the driver may hold at once: k_max + 2.

        A pending step s was launched with a version >= s - k and the oldest pending step
        is the next one to train, so versions latest - k .. latest are live: k + 1; one
        more of slack for the version being published.
        """
        return self.k_max + 2

    def observe(self, obs: StepObservation) -> Decision | None: ...

    def state(self) -> dict: ...

    def load_state(self, state: dict) -> None: ...


class FixedStaleness(StalenessPolicy):
    """k never changes."""

    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"staleness k must be >= 0, got {k}")
        self._k = k

    @property
    def k(self) -> int:
        return self._k

    @property
    def k_max(self) -> int:
        return self._k

    def observe(self, obs: StepObservation) -> Decision | None:
        return None

    def state(self) -> dict:
        return {"k": self._k}

    def load_state(self, state: dict) -> None:
        self._k = int(state["k"])
