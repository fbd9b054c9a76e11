"""Placement groups: reserve stages' actors together, packed on one node or spread over many.

resources.placement.groups lists stages whose actors must be co-located (e.g. learner,
rescorer and teacher on one GPU node with STRICT_PACK) or kept apart (SPREAD). Each group
becomes one Ray placement group with one bundle per actor, holding that stage's
resources; actors then take the bundles in order. A group the cluster cannot hold is an
error naming its bundles and the cluster's resources after the start-up deadline, never
a hang (on an autoscaling cluster the pending group is what asks for the nodes).

`fit` places a pipeline's actors on a described cluster (e.g. 2 nodes x 4 GPUs) without
Ray, with the same bundles and group strategies: `opdflow validate --cluster 2x4:72`.
"""

from __future__ import annotations

import math
from typing import Any

from opdflow.config import STAGES, PipelineConfig, ResourcesConfig, StageResources
from opdflow.core.actor_name import actor_name, stage_of
from opdflow.errors import ConfigError

LIGHT_CPU = 0.01
"""A bundle must ask for something: stages that reserve no resources take this much CPU."""


def bundle(res: StageResources) -> dict[str, float]:
    """The Ray bundle one actor of a stage needs."""
    b = {"CPU": res.num_cpus, "GPU": res.num_gpus, **res.resources}
    b = {k: float(v) for k, v in b.items() if v}
    return b or {"CPU": LIGHT_CPU}


def grouped_actors(cfg: PipelineConfig) -> dict[str, int]:
    """Actors per stage that placement groups hold bundles for (the others: one): the
    starting generator replicas and the learner's ranks."""
    return {"generator": cfg.engine.replicas, "learner": cfg.resources.learner.workers}


def cpu_need(cfg: PipelineConfig) -> float:
    """Ray CPUs a run holds at its largest: each generator replica the pool may grow to
    (engine.max_replicas), each of the learner's workers, one rescorer, teacher, evaluator.
    A local cluster is started with at least this many (Session)."""
    r, e = cfg.resources, cfg.engine
    return (
        r.generator.num_cpus * max(e.replicas, e.max_replicas or 0)
        + r.learner.num_cpus * r.learner.workers
        + sum(s.num_cpus for s in (r.rescorer, r.teacher, r.evaluator))
    )


NEXT: Any = object()
"""Placement.options' default place: the stage's next free bundle (None outside groups)."""


class Placement:
    """The run's placement groups, the next free bundle of each grouped stage, and each
    stage's Ray actor options (`options`)."""

    def __init__(
        self, resources: ResourcesConfig, actors_per_stage: dict[str, int], max_restarts: int = 0
    ):
        """`max_restarts`: reliability.max_restarts, of every stage actor but the learner's."""
        self.resources, self.max_restarts = resources, max_restarts
        self.strategy = resources.placement.strategy
        self.groups: list[tuple[list[str], list[dict[str, float]]]] = []
        self.actors: list[list[str]] = []  # per group, the actor of each bundle
        self._slots: dict[str, list[tuple[int, int]]] = {}  # stage -> [(group, bundle)]
        for g, stages in enumerate(resources.placement.groups):
            bundles: list[dict[str, float]] = []
            names: list[str] = []
            for stage in stages:
                count = actors_per_stage.get(stage, 1)
                for i in range(count):
                    self._slots.setdefault(stage, []).append((g, len(bundles)))
                    bundles.append(bundle(getattr(resources, stage)))
                    names.append(actor_name(stage, i, count))
            self.groups.append((stages, bundles))
            self.actors.append(names)
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

    def options(self, stage: str, where: Any = NEXT) -> dict[str, Any]:
        """The Ray options of the stage's next actor, all in one: its resources
        (resources.<stage>), its restarts (max_restarts; none for the learner, whose
        state Ray cannot restore: it heals) and its place: the stage's next bundle, or
        `where` (a scheduling strategy; None: anywhere)."""
        restarts = 0 if stage == "learner" else self.max_restarts
        opts = actor_options(getattr(self.resources, stage), max_restarts=restarts)
        where = self.scheduling(stage) if where is NEXT else where
        if where is not None:
            opts["scheduling_strategy"] = where
        return opts

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


# ---------------------------------------------------------------- fitting a described cluster


def parse_cluster(spec: str) -> list[dict[str, float]]:
    """'2x4' = 2 nodes of 4 GPUs (CPUs unbounded); '2x4:72' = and 72 CPUs each."""
    try:
        shape, _, cpus = spec.strip().partition(":")
        n, gpus = (int(x) for x in shape.lower().split("x"))
        node = {"GPU": float(gpus), "CPU": float(cpus) if cpus else math.inf}
        if n < 1 or gpus < 0 or node["CPU"] <= 0:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"cluster {spec!r} is not allowed: expected NODESxGPUS[:CPUS], e.g. 2x4 or 2x4:72"
        ) from None
    return [dict(node) for _ in range(n)]


def check_gpu_shares(cfg: PipelineConfig) -> None:
    """GPU counts that tile a GPU: whole numbers, or 1/n so n actors fill one exactly; a
    vLLM generator takes one whole GPU per tensor-parallel rank, all in its one bundle."""
    for stage in STAGES:
        g = getattr(cfg.resources, stage).num_gpus
        if 0 < g < 1 and abs(1 / g - round(1 / g)) > 1e-6:
            raise ConfigError(
                f"resources.{stage}.num_gpus = {g!r} does not divide a GPU: use 1/n "
                f"(e.g. {1 / math.ceil(1 / g):g}) or a whole number"
            )
        if g > 1 and g != int(g):
            raise ConfigError(
                f"resources.{stage}.num_gpus = {g!r}: above 1 Ray takes whole GPUs only"
            )
    g, tp = cfg.resources.generator.num_gpus, cfg.engine.tensor_parallel_size
    if cfg.engine.kind == "vllm" and g not in (0, tp):
        raise ConfigError(
            f"resources.generator.num_gpus = {g!r} with engine.kind='vllm' and "
            f"engine.tensor_parallel_size = {tp}: a vLLM replica takes one whole GPU per "
            f"tensor-parallel rank, so it takes {tp} GPU{'s' if tp > 1 else ''} (set "
            f"resources.generator.num_gpus={tp}; 0: vLLM's CPU build)"
        )


def _fits(free: dict[str, float], b: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in b.items())


def _take(free: dict[str, float], b: dict[str, float]) -> None:
    for k, v in b.items():
        free[k] = free.get(k, 0.0) - v


def describe(res: dict[str, float]) -> str:
    """'8 CPU, 1 GPU, 1 rollout': CPUs and GPUs first, then custom resources."""
    keys = [k for k in ("CPU", "GPU") if k in res] + sorted(
        k for k in res if k not in ("CPU", "GPU")
    )
    return ", ".join(f"{res[k]:g} {k}" for k in keys) or "nothing"


def _largest(nodes: list[dict[str, float]], names: list[str], asks: dict[str, float]) -> str:
    """The largest node (GPUs, then CPUs) of those offering every custom resource `asks`
    names, described; or which custom resources no node offers."""
    custom = [k for k in asks if k not in ("CPU", "GPU")]
    offering = [i for i, n in enumerate(nodes) if all(n.get(k, 0) > 0 for k in custom)]
    if not offering:
        return f"no node offers {', '.join(custom)}"
    i = max(offering, key=lambda i: (nodes[i].get("GPU", 0.0), nodes[i].get("CPU", 0.0)))
    with_custom = f" with {', '.join(custom)}" if custom else ""
    return f"the largest node{with_custom}, {names[i]}, has {describe(nodes[i])}"


def check_sizes(cfg: PipelineConfig, nodes: list[dict[str, float]], names: list[str]) -> None:
    """Refuse a stage one of whose actors no node could hold even empty (or a STRICT_PACK
    group no node could hold), naming the stage, what it asks and the largest node."""
    r = cfg.resources
    for stage in STAGES:
        b = bundle(getattr(r, stage))
        if not any(_fits(n, b) for n in nodes):
            raise ConfigError(
                f"resources.{stage} asks {describe(b)} per actor, more than any node has: "
                f"{_largest(nodes, names, b)}"
            )
    if r.placement.strategy != "STRICT_PACK":
        return
    counts = grouped_actors(cfg)
    for stages in r.placement.groups:
        total: dict[str, float] = {}
        for stage in stages:
            for k, v in bundle(getattr(r, stage)).items():
                total[k] = total.get(k, 0.0) + v * counts.get(stage, 1)
        if not any(_fits(n, total) for n in nodes):
            raise ConfigError(
                f"resources.placement.groups: {'+'.join(stages)} (STRICT_PACK) asks "
                f"{describe(total)} on one node, more than any node has: "
                f"{_largest(nodes, names, total)}"
            )


def fit(
    cfg: PipelineConfig, nodes: list[dict[str, float]], names: list[str] | None = None
) -> dict[str, int]:
    """Place every actor of `cfg` on `nodes` (resource dicts, called `names` in errors;
    default "node i"); returns actor -> node index.

    Placement groups first, as Placement reserves them (STRICT_PACK: one node; PACK: one
    node if any holds the group, else bundle by bundle; SPREAD / STRICT_SPREAD: distinct
    nodes, preferred / required), then the other actors largest first, first fit; the
    generator counts at its largest pool (engine.max_replicas). Greedy, like a scheduler:
    a fit is a placement that works, a ConfigError names the actor that found no room.
    """
    check_gpu_shares(cfg)
    labels = names or [f"node {i}" for i in range(len(nodes))]
    check_sizes(cfg, nodes, labels)
    r, e = cfg.resources, cfg.engine
    free = [dict(n) for n in nodes]
    where: dict[str, int] = {}
    placement = Placement(r, grouped_actors(cfg))
    strategy = placement.strategy

    def left() -> str:
        return "; ".join(
            f"{labels[i]}: " + ", ".join(f"{v:g} {k}" for k, v in sorted(f.items()))
            for i, f in enumerate(free)
        )

    for (stages, bundles), names in zip(placement.groups, placement.actors):
        total: dict[str, float] = {}
        for b in bundles:
            for k, v in b.items():
                total[k] = total.get(k, 0.0) + v
        one = next((i for i, f in enumerate(free) if _fits(f, total)), None)
        if strategy in ("STRICT_PACK", "PACK") and one is not None:
            for name, b in zip(names, bundles):
                _take(free[one], b)
                where[name] = one
            continue
        if strategy == "STRICT_PACK":
            raise ConfigError(
                f"resources.placement.groups: {'+'.join(stages)} (STRICT_PACK) needs "
                f"{total} on one node; free: {left()}"
            )
        used: set[int] = set()
        for name, b in zip(names, bundles):
            order = sorted(range(len(free)), key=lambda i: i in used) if "SPREAD" in strategy \
                else list(range(len(free)))  # fmt: skip
            if strategy == "STRICT_SPREAD":
                order = [i for i in order if i not in used]
            i = next((i for i in order if _fits(free[i], b)), None)
            if i is None:
                raise ConfigError(
                    f"resources.placement.groups: {name} of {'+'.join(stages)} ({strategy}) "
                    f"needs {b}; free: {left()}"
                )
            _take(free[i], b)
            where[name] = i
            used.add(i)
    counts = {"generator": max(e.replicas, e.max_replicas or 0), "learner": r.learner.workers}
    rest = [
        (actor_name(stage, i, counts.get(stage, 1)), bundle(getattr(r, stage)))
        for stage in STAGES
        for i in range(counts.get(stage, 1))
        if actor_name(stage, i, counts.get(stage, 1)) not in where
    ]
    rest.sort(key=lambda nb: (-nb[1].get("GPU", 0.0), -nb[1].get("CPU", 0.0)))
    for name, b in rest:
        i = next((i for i, f in enumerate(free) if _fits(f, b)), None)
        if i is None:
            stage = stage_of(name)
            raise ConfigError(
                f"{name} (resources.{stage}) needs {b} and no node has it left; free: {left()}"
            )
        _take(free[i], b)
        where[name] = i
    return where


def actor_options(
    res: StageResources, name: str | None = None, max_restarts: int = 0
) -> dict[str, Any]:
    """Ray actor options for a stage from its configured resources."""
    opts: dict[str, Any] = {
        "num_cpus": res.num_cpus,
        "num_gpus": res.num_gpus,
        "max_restarts": max_restarts,
        # a restarted actor re-runs the calls it held, with the same arguments
        "max_task_retries": -1 if max_restarts else 0,
    }
    if res.resources:
        opts["resources"] = dict(res.resources)
    if name:
        opts["name"] = name
    return opts
