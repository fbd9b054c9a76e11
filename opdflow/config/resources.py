"""Ray resources per stage, and the placement groups that keep stages together or apart."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from opdflow.config.rules import fail, nonnegative, one_of, positive


@dataclass
class StageResources:
    """Ray resources of one stage's actors."""

    num_cpus: float = 1.0
    """Logical CPUs reserved per actor."""
    num_gpus: float = 0.0
    """GPUs per actor."""
    torch_threads: int = 1
    """torch intra-op threads inside the actor (pinned so stages do not fight for cores)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources, e.g. {"rollout": 1} to place on rollout nodes."""

    def validate(self, path: str) -> None:
        nonnegative(f"{path}.num_cpus", self.num_cpus)
        nonnegative(f"{path}.num_gpus", self.num_gpus)
        positive(f"{path}.torch_threads", self.torch_threads)


@dataclass
class LearnerResources(StageResources):
    """Ray resources of the learner: each of its `workers` actors gets num_cpus/num_gpus."""

    workers: int = 1
    """Learner actors (ranks), one GPU each where it has GPUs; they may span nodes. The
    student is sharded with FSDP2 over them (parameters, gradients and AdamW state split N
    ways, built on the meta device and loaded shard by shard) whenever N > 1 or the learner
    has a GPU; one CPU worker trains an unsharded FP32 model. The step's micro-batches are
    dealt to the ranks: loss and weights equal one worker's within float tolerance, and a
    sharded checkpoint from N workers resumes on any M."""
    min_workers: int = 1
    """Fewest ranks a learner that lost a rank may heal onto (reliability.
    learner_recovery_timeout_s): below it the run ends with its last checkpoint."""

    def validate(self, path: str) -> None:
        super().validate(path)
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            fail(f"{path}.workers", self.workers, "an integer >= 1 (1 = a single learner actor)")
        ok = isinstance(self.min_workers, int) and not isinstance(self.min_workers, bool)
        if not ok or not 1 <= self.min_workers <= self.workers:
            fail(
                f"{path}.min_workers",
                self.min_workers,
                f"an integer from 1 to workers ({self.workers})",
            )


def _light() -> StageResources:
    return StageResources(num_cpus=0.0)


STAGES = ("generator", "learner", "rescorer", "teacher", "evaluator")
"""The pipeline's stages, as resources.<stage> and placement groups name them."""
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
"""Ray's placement-group strategies."""


@dataclass
class PlacementConfig:
    """Ray placement groups: stages whose actors are reserved together, packed or spread."""

    groups: list[list[str]] = field(default_factory=list)
    """Each a list of stage names (generator, learner, rescorer, teacher, evaluator) whose
    actors get one placement group, one bundle per actor (the generator: one per starting
    replica; replicas the pool adds later are placed outside it). [] = no placement groups."""
    strategy: str = "PACK"
    """Ray strategy of every group: PACK, SPREAD, STRICT_PACK (one node) or STRICT_SPREAD."""

    def validate(self, path: str) -> None:
        one_of(f"{path}.strategy", self.strategy, STRATEGIES)
        seen: set[str] = set()
        for i, group in enumerate(self.groups):
            if not isinstance(group, list) or not group:
                fail(f"{path}.groups[{i}]", group, "a non-empty list of stage names")
            for stage in group:
                one_of(f"{path}.groups[{i}]", stage, STAGES)
                if stage in seen:
                    fail(f"{path}.groups[{i}]", group, f"each stage in one group ({stage!r} twice)")
                seen.add(stage)


@dataclass
class ResourcesConfig:
    """Resources per stage."""

    generator: StageResources = field(default_factory=StageResources)
    """Each rollout engine replica."""
    learner: LearnerResources = field(default_factory=LearnerResources)
    """The learner (per worker; `workers` of them)."""
    rescorer: StageResources = field(default_factory=_light)
    """The BF16 rescorer."""
    teacher: StageResources = field(default_factory=_light)
    """The teacher scorer."""
    evaluator: StageResources = field(default_factory=_light)
    """The held-out evaluator."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Placement groups for stages that must share a node or be spread."""

    def validate(self, path: str) -> None:
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate(f"{path}.{f.name}")
