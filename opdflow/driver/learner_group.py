"""The learner's ranks as the driver holds them: each one watched, a lost one named at once.

Rank 0 of the learner (stages/learner_actor.py) starts the other ranks and answers every
call; a rank that dies leaves the others blocked in a collective until its timeout (30
minutes for gloo). So the driver keeps every rank's handle and node, and on each rank one
call that never returns (`watch`): Ray fails it as soon as it knows that the rank's
process or node is gone, and the driver waits on these beside whatever it waits for (a
batch, a learner call), so a loss reaches it within moments, not at a collective's
timeout. A learner call that fails for another reason (a peer's socket closed mid-
collective before Ray knew of its node) is checked with pings, answered by a thread of
their own even while a rank is blocked in a collective: a rank that does not answer is lost.

`place_ranks` finds where a new group goes after a loss: as many ranks as before if the
cluster can place them within reliability.learner_recovery_timeout_s, else fewer, down to
resources.learner.min_workers (a placement group reserves them all at once, so a group is
never started half placed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError

from opdflow.cluster.placement import bundle
from opdflow.cluster.supervisor import LearnerLost
from opdflow.config import PipelineConfig

PING_S = 10.0
"""A rank that does not answer a ping within this many seconds (after a learner call
failed) is lost; a live one answers in milliseconds, from a thread of its own."""
FEWER_WAIT_S = 10.0
"""How long a smaller group may take to be placed, once the full one could not be: it
fits in what the cluster has now, or not at all."""


@dataclass
class LearnerGroup:
    """One learner group: its ranks (rank 0 first), where each runs, and the watch on each."""

    ranks: list[Any]
    where: list[dict[str, Any]]
    """Per rank: rank, pid, node (IP) and node_id (LearnerActor.where)."""
    watches: list[Any]
    """Per rank, the ref of its `watch` call: it fails when the rank dies."""
    timeline: int = 0
    placement_group: Any = None
    """The placement group a healed group was placed in (released with the group)."""
    lost: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, leader: Any, timeline: int = 0, placement_group: Any = None) -> LearnerGroup:
        """The group rank 0 `leader` leads (every rank running), each rank now watched."""
        ranks = ray.get(leader.ranks.remote())
        where = ray.get([r.where.remote() for r in ranks])
        return cls(ranks, where, [r.watch.remote() for r in ranks], timeline, placement_group)

    @property
    def leader(self) -> Any:
        return self.ranks[0]

    def get(self, ref: Any) -> Any:
        """A learner call's result; LearnerLost as soon as a rank dies while it runs, or
        when the call failed and a rank is gone (else the call's own error)."""
        ready, _ = ray.wait([ref, *self.watches], num_returns=1)
        if ready[0] != ref:  # ready refs come in the order asked: a watch, not the call
            raise self.lost_now()
        try:
            return ray.get(ref)
        except RayError as exc:
            if lost := self.lost_ranks():
                raise LearnerLost.of(exc, lost) from exc
            raise

    def lost_now(self) -> LearnerLost:
        """The loss a finished watch reports: the ranks whose watch has failed by now."""
        done, _ = ray.wait(self.watches, num_returns=len(self.watches), timeout=0)
        ranks = self._not_with_owner([i for i, w in enumerate(self.watches) if w in done])
        told = [w for w in self.watches if w in done]  # rank 0's own, when it has come
        return LearnerLost.of(self.watches[0] if self.watches[0] in done else told[0], ranks)

    def lost_ranks(self, wait_s: float = PING_S) -> list[int]:
        """Ranks whose watch has failed or that do not answer a ping within wait_s."""
        pings = [r.alive.remote() for r in self.ranks]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=wait_s)
        dead, _ = ray.wait(self.watches, num_returns=len(self.watches), timeout=0)
        out = []
        for i, ping in enumerate(pings):
            try:
                ok = ping in ready and self.watches[i] not in dead and ray.get(ping) == i
            except RayError:
                ok = False
            if not ok:
                out.append(i)
        return self._not_with_owner(out)

    def _not_with_owner(self, ranks: list[int]) -> list[int]:
        """`ranks` with the peers that died only because rank 0, which started them (their
        owner), died, named as rank 0: Ray ends an actor with its owner, and may report the
        peer's end before rank 0's."""
        done, _ = ray.wait(self.watches, num_returns=len(self.watches), timeout=0)

        def with_owner(rank: int) -> bool:
            if rank == 0 or self.watches[rank] not in done:
                return False
            try:
                ray.get(self.watches[rank], timeout=0)
            except RayError as exc:
                return "because its owner has died" in str(exc)
            return False

        followers = {r for r in ranks if with_owner(r)}
        return sorted((set(ranks) - followers) | ({0} if followers else set()))

    def nodes(self, ranks: list[int]) -> list[dict[str, Any]]:
        """The nodes of `ranks`: IP, id, and whether Ray still counts the node alive."""
        alive = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
        seen: dict[str, dict[str, Any]] = {}
        for r in ranks:
            w = self.where[r]
            seen.setdefault(w["node_id"], {"node": w["node"], "node_id": w["node_id"],
                                           "node_alive": alive.get(w["node_id"], False)})  # fmt: skip
        return list(seen.values())

    def stop(self) -> None:
        """Kill every rank still running (rank 0 first: the others die with it)."""
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)

    def release(self) -> None:
        """Stop the ranks and give back the placement group of a healed group."""
        self.stop()
        if self.placement_group is not None:
            from ray.util import remove_placement_group

            remove_placement_group(self.placement_group)
            self.placement_group = None


def place_ranks(
    cfg: PipelineConfig, slots: list[Any], timeout_s: float
) -> tuple[list[Any], Any] | None:
    """Where a new learner group's ranks go: (one scheduling strategy per rank, the new
    placement group or None), with as many ranks as `slots` if they are placed within
    `timeout_s`, else as many as can be now, down to resources.learner.min_workers; None
    when not even that many can.

    A learner in one of the run's placement groups (`slots` are its bundles) goes back into
    its bundles once Ray has them placed (after a node loss Ray places a lost bundle
    again where it fits), or into those still placed; one placed anywhere gets a
    placement group of its own (PACK) holding all its ranks."""
    from ray.util import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    least = cfg.resources.learner.min_workers
    if any(s is not None for s in slots):
        placed = _placed_bundles(slots, timeout_s)
        return (placed, None) if len(placed) >= least else None
    ask = bundle(cfg.resources.learner)
    for n in range(len(slots), least - 1, -1):
        pg = placement_group([ask] * n, strategy="PACK")
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s if n == len(slots) else FEWER_WAIT_S)
        if ready:
            return [PlacementGroupSchedulingStrategy(pg, i) for i in range(n)], pg
        remove_placement_group(pg)
    return None


def _placed_bundles(slots: list[Any], timeout_s: float) -> list[Any]:
    """The slots (placement-group bundles) that are placed: all of them once their groups
    are, waiting up to timeout_s; else the ones on a live node."""
    from ray.util import placement_group_table

    deadline = time.monotonic() + timeout_s
    while True:
        tables = {id(s.placement_group): placement_group_table(s.placement_group) for s in slots}
        if all(t.get("state") == "CREATED" for t in tables.values()):
            return list(slots)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    return [
        s for s in slots
        if tables[id(s.placement_group)].get("bundles_to_node_id", {})
        .get(s.placement_group_bundle_index) in alive
    ]  # fmt: skip
