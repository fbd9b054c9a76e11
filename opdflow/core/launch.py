"""The launch rule: when a step's generation starts and whether its finished batch may train.

Generation for step s starts once version s - k exists, with the freshest version
(`launch_version`); steps start in order, each once. When s is next to train, its batch
must be within the bound under the k in effect then (`within_bound`); a batch that is not
(k was lowered after its launch) is dropped and s is launched again with the freshest
version. `Launches` holds that rule's state: the controller (driver/controller.py) and the
simulator (analysis/simulator.py) both drive one, so the simulator replays exactly what a
run does. `replay` reconstructs from a run's record of what each step cost what the rule
must have trained, the check that a record and the rule agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from opdflow.core.staleness import StalenessPolicy, StepObservation, launch_version, within_bound


@dataclass
class Launches:
    """The steps launched so far and the batches dropped, under `policy`'s k."""

    policy: StalenessPolicy
    steps: int
    """Learner steps of the run; nothing at or past it is launched."""
    next_step: int = 0
    """The first step not launched yet (a resumed run starts at its checkpoint's step)."""
    dropped: int = 0
    """Batches refused by `admit` (each one's step is launched again)."""

    def due(self, latest: int) -> list[tuple[int, int]]:
        """(step, version) of every step whose generation may start now that version
        `latest` is the freshest, in step order; each step is returned once."""
        out = []
        while self.next_step < self.steps:
            version = launch_version(self.next_step, self.policy.k, latest)
            if version is None:
                break
            out.append((self.next_step, version))
            self.next_step += 1
        return out

    def rewind(self, step: int, dropped: int) -> None:
        """Back to a checkpoint at `step` (a learner that healed): steps from it are launched
        again; `dropped` is the count the checkpoint holds."""
        self.next_step, self.dropped = step, dropped

    def admit(self, step: int, version: int) -> bool:
        """Whether step's finished batch, generated at `version`, may train it under the k in
        effect now; a refused one is counted in `dropped` and its step must be launched again
        with the freshest version."""
        if within_bound(step, version, self.policy.k):
            return True
        self.dropped += 1
        return False


@dataclass(frozen=True)
class Trained:
    """What the rule trained at one step: the batch's version and k after the step."""

    step: int
    version: int
    k: int
    dropped: int
    """Batches dropped so far (this step's included)."""


def replay(
    policy: StalenessPolicy, observations: Iterable[StepObservation], first: int = 0
) -> list[Trained]:
    """The versions the rule trains when `policy` sees `observations` (one per step from
    `first`, in order), each step's batch ready only once it is that step's turn.

    A run's metrics hold each step's observation, version, k and dropped count, so a run
    that followed the rule is reproduced exactly (given a fresh policy like the run's).
    """
    obs = list(observations)
    gate = Launches(policy, first + len(obs), first)
    latest = first
    version = dict(gate.due(latest))
    out = []
    for o in obs:
        while not gate.admit(o.step, version[o.step]):
            version[o.step] = latest  # launched again with the freshest version
        policy.observe(o)
        out.append(Trained(o.step, version[o.step], policy.k, gate.dropped))
        latest = o.step + 1
        version.update(gate.due(latest))
    return out
