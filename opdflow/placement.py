"""Placement groups: reserve stages' actors together, packed on one node or spread over many.

resources.placement.groups lists stages whose actors must be co-located (e.g. learner,
rescorer and teacher on one GPU node with STRICT_PACK) or kept apart (SPREAD). Each group
becomes one Ray placement group with one bundle per actor, holding that stage's
resources; actors then take the bundles in order. A group the cluster cannot hold is an
error naming its bundles and the cluster's resources after the start-up deadline, never
a hang (on an autoscaling cluster the pending group is what asks for the nodes).
"""

from __future__ import annotations

from typing import Any

from opdflow.config import ResourcesConfig, StageResources

LIGHT_CPU = 0.01
"""A bundle must ask for something: stages that reserve no resources take this much CPU."""


def bundle(res: StageResources) -> dict[str, float]:
    """The Ray bundle one actor of a stage needs."""
    b = {"CPU": res.num_cpus, "GPU": res.num_gpus, **res.resources}
    b = {k: float(v) for k, v in b.items() if v}
    return b or {"CPU": LIGHT_CPU}


class Placement:
    """The run's placement groups, and the next free bundle of each grouped stage."""

    def __init__(self, resources: ResourcesConfig, actors_per_stage: dict[str, int]):
        self.strategy = resources.placement.strategy
        self.groups: list[tuple[list[str], list[dict[str, float]]]] = []
        self._slots: dict[str, list[tuple[int, int]]] = {}  # stage -> [(group, bundle)]
        for g, stages in enumerate(resources.placement.groups):
            bundles: list[dict[str, float]] = []
            for stage in stages:
                for _ in range(actors_per_stage.get(stage, 1)):
                    self._slots.setdefault(stage, []).append((g, len(bundles)))
                    bundles.append(bundle(getattr(resources, stage)))
            self.groups.append((stages, bundles))
        self.pgs: list[Any] = []

    def reserve(self, timeout_s: float) -> str | None:
        """Create every group and wait until placed; returns what could not be, or None."""
        import ray
        from ray.util import placement_group

        self.pgs = [placement_group(b, strategy=self.strategy) for _, b in self.groups]
        missing = []
        for (stages, bundles), pg in zip(self.groups, self.pgs):
            ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
            if not ready:
                missing.append(f"group {'+'.join(stages)} ({self.strategy}): bundles {bundles}")
        return "; ".join(missing) or None

    def scheduling(self, stage: str) -> Any:
        """The scheduling strategy of the stage's next actor (None: outside any group)."""
        slots = self._slots.get(stage)
        if not slots or not self.pgs:
            return None
        g, index = slots.pop(0)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            self.pgs[g],
            placement_group_bundle_index=index,
            placement_group_capture_child_tasks=False,
        )

    def release(self) -> None:
        from ray.util import remove_placement_group

        for pg in self.pgs:
            remove_placement_group(pg)
        self.pgs = []
