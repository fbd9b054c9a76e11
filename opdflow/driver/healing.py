"""A learner that heals itself: a lost rank costs a rewind to the last checkpoint, not the run.

The learner holds the run's state, so Ray cannot just restart one of its ranks: the others
would wait for it in a collective, and its shard of the weights and optimizer is gone.
When a rank dies (its process, or its node) the `Healer`:

1. hears of it at once from the rank's watch (learner_group.py), wherever the driver waits;
2. stops the surviving ranks, and abandons a checkpoint still being written;
3. places a new group: as many ranks as configured if the cluster can place them within
   reliability.learner_recovery_timeout_s, else fewer, down to resources.learner.min_workers;
4. loads the last committed checkpoint into it (DCP reshards N ranks' shards onto M), or
   rewinds to the run's start when none was committed yet;
5. rewinds the controller to that step: every batch in flight and every weights version
   published after the checkpoint belongs to a timeline that no longer exists, so the
   batches are cancelled and the versions dropped; the new group publishes on a new
   timeline (WeightsRef.timeline), so no consumer mistakes its version 12 for the new
   version 12, and collective consumers pair again with the new rank 0. Metrics rows and
   held-out evaluations after the checkpoint are replaced by the replayed steps' (the run
   directory's truncate, as a resume does). Each step's prompts and seeds are a function
   of the step, so a replay at k = 0 trains what the lost steps trained.

Every loss is on the record: a `learner_lost` event (ranks, nodes, cause) and a
`learner_recovered` event (the rewind from step to step, steps replayed, seconds to
recover, the work thrown away, ranks before and after), and the summary's
`learner_losses` with the updates/hour each one cost. More losses than
reliability.max_learner_recoveries end the run, naming the checkpoint and how to resume.
"""

from __future__ import annotations

import contextlib
from typing import Any

import ray
from ray.exceptions import RayError

from opdflow.cluster.supervisor import LearnerLost, Link, StageFailed, diagnose
from opdflow.config import PipelineConfig
from opdflow.core.launch import Launches
from opdflow.driver.assembly import Stages, make_learner
from opdflow.driver.learner_group import LearnerGroup, place_ranks
from opdflow.driver.wiring import RunWiring
from opdflow.record.checkpoint import Checkpoint, load_latest
from opdflow.record.rundir import RunDir


class Healer:
    """The learner's group and what healing it has cost so far."""

    def __init__(
        self, cfg: PipelineConfig, run: RunDir, st: Stages, wiring: RunWiring, clock: Any,
        first: int,
    ):  # fmt: skip
        """`clock`: the run's StepClock (its `elapsed`); `first`: the step the run started at."""
        self.cfg, self.run, self.st, self.wiring, self.clock = cfg, run, st, wiring, clock
        self.group = LearnerGroup.of(st.learner)
        run.event("learner_group", timeline=0, ranks=self.group.where)
        self.first = self.done = first
        """done: steps the current group has trained (a loss after a step's training, in its
        publish or checkpoint, has cost that step too)."""
        self.start_policy = st.policy.state()
        self.recoveries: list[dict[str, Any]] = []

    @property
    def watches(self) -> list[Any]:
        """Refs that fail when a learner rank dies (wait on them beside a batch)."""
        return self.group.watches

    def get(self, ref: Any) -> Any:
        """A learner call's result, or LearnerLost as soon as a rank is lost."""
        return self.group.get(ref)

    def checkpoint(self, step: int, state: dict[str, Any], wait: bool = False) -> None:
        """The learner's checkpoint after `step` steps, with the loop's `state` (written in
        the background, committed once complete: RunWiring.checkpoint); wait: committed
        before this returns."""
        self.wiring.checkpoint(self.st.learner, state, step, self.get)
        if wait:
            self.commit(wait=True)

    def commit(self, wait: bool = False) -> None:
        """Commit the checkpoint being written once complete (wait: until it is)."""
        self.wiring.commit_written(self.st.learner, self.get, wait)

    def train(self, step: int, job_ref: Any, links: list[Link]) -> dict[str, Any]:
        """The learner's step on the batch `job_ref` (the last of `links`): LearnerLost if a
        rank is lost, else a batch's failed stage is named (diagnose)."""
        try:
            out = self.group.get(self.st.learner.train_step.remote(step, job_ref))
        except RayError as exc:
            raise diagnose(links, exc) from exc
        self.done = step + 1
        return out

    def heal(
        self, error: BaseException, step: int, pending: dict[int, Any], gate: Launches, rows: Any
    ) -> int:
        """Heal from `error` (LearnerLost, or a learner call's RayError) met at `step`: a new
        group from the last committed checkpoint, `pending` batches cancelled, `gate` and
        `rows` rewound. Returns the step to go on from. Re-raises an error that lost no
        rank; StageFailed when the losses exceed reliability.max_learner_recoveries or no
        group can be placed."""
        old, rel, run = self.group, self.cfg.reliability, self.run
        lost = error if isinstance(error, LearnerLost) else None
        ranks = lost.ranks if lost is not None and lost.ranks else old.lost_ranks()
        if not ranks:
            raise error
        t0, cause = self.clock.elapsed(), (lost or LearnerLost.of(error)).cause
        step, nodes = max(step, self.done), old.nodes(ranks)
        run.event("learner_lost", step=step, ranks=ranks, nodes=nodes, cause=cause,
                  workers=len(old.ranks), timeline=old.timeline)  # fmt: skip
        old.stop()
        self.wiring.abandon_checkpoint()
        ckpt = load_latest(self.wiring.inputs.checkpoint_root)
        if len(self.recoveries) >= rel.max_learner_recoveries:
            raise StageFailed(
                "learner", f"lost rank(s) {ranks} on {_on(nodes)} ({cause}); this is learner "
                f"loss {len(self.recoveries) + 1} and the run heals from at most "
                f"reliability.max_learner_recoveries = {rel.max_learner_recoveries}",
                self._resume_hint(ckpt),
            )  # fmt: skip
        t1 = self.clock.elapsed()
        new = self._new_group(old.timeline + 1, ckpt)
        t2 = self.clock.elapsed()
        if old.placement_group in self.wiring.placement.pgs:
            self.wiring.placement.pgs.remove(old.placement_group)
        old.release()
        self.group, self.st.learner = new, new.leader
        run.event("learner_group", timeline=new.timeline, ranks=new.where)
        to = self.done = self._rewind(new, ckpt, pending, gate, rows)
        wasted = t0 - self._time_of(to)
        record = {
            "from_step": step, "to_step": to, "replayed_steps": step - to,
            "recover_s": self.clock.elapsed() - t0, "group_s": t2 - t1,
            "load_s": self.clock.elapsed() - t2, "wasted_s": max(0.0, wasted),
            "ranks": ranks, "nodes": old.nodes(ranks), "workers_before": len(old.ranks),
            "workers_after": len(new.ranks), "timeline": new.timeline,
            "checkpoint": str(ckpt.path) if ckpt else None,
        }  # fmt: skip
        self.recoveries.append(record)
        run.event("learner_recovered", **record)
        return to

    def _new_group(self, timeline: int, ckpt: Checkpoint | None) -> LearnerGroup:
        """A learner group placed as place_ranks allows, running, on `timeline`."""
        cfg, rel = self.cfg, self.cfg.reliability
        placed = place_ranks(cfg, self.st.learner_slots, rel.learner_recovery_timeout_s)
        if placed is None:
            raise StageFailed(
                "learner", f"after losing a rank, not even resources.learner.min_workers = "
                f"{cfg.resources.learner.min_workers} rank(s) could be placed within "
                f"reliability.learner_recovery_timeout_s = {rel.learner_recovery_timeout_s:g} s "
                f"(the cluster has {ray.available_resources()} free)", self._resume_hint(ckpt),
            )  # fmt: skip
        slots, pg = placed
        if pg is not None:  # the run's groups: released with the run at the latest
            self.wiring.placement.pgs.append(pg)
        leader = make_learner(self.st.specs.learner, self.wiring.placement, slots, timeline)
        ready, _ = ray.wait([leader.pid.remote()], timeout=rel.startup_timeout_s)
        try:
            if not ready:
                raise StageFailed("learner", f"a new learner group of {len(slots)} rank(s) was "
                                  f"placed but not running after {rel.startup_timeout_s:g} s",
                                  self._resume_hint(ckpt))  # fmt: skip
            return LearnerGroup.of(leader, timeline, pg)
        except RayError as exc:
            raise StageFailed("learner", f"a new learner group did not start: "
                              f"{LearnerLost.of(exc).cause}", self._resume_hint(ckpt)) from exc  # fmt: skip
        except StageFailed:
            ray.kill(leader)
            raise

    def _rewind(
        self, new: LearnerGroup, ckpt: Checkpoint | None, pending: dict[int, Any],
        gate: Launches, rows: Any,
    ) -> int:  # fmt: skip
        """Load `ckpt` (None: the run's start) into the new group and drop everything of the
        abandoned timeline; returns the step it rewound to."""
        st, leader = self.st, new.leader
        self.wiring.check_checkpoint_root(leader)
        if ckpt is not None:
            new.get(leader.load_checkpoint.remote(str(ckpt.path), ckpt.step))
        to = ckpt.step if ckpt is not None else self.first
        st.policy.load_state(ckpt.state["policy"] if ckpt else self.start_policy)
        for job in pending.values():  # batches of the old timeline: their work is lost
            _cancel(link.ref for link in job.links)
        pending.clear()
        evals, st.evals = st.evals, {}
        _cancel(evals.values())
        st.store.release_below(st.store.latest + 1)
        st.store.publish(new.get(leader.publish.remote()))
        for version in [v for v in evals if v == to]:  # version 0, before any checkpoint
            st.evaluate(version)
        self.run.truncate(to, event="rewind")
        gate.rewind(to, ckpt.state["dropped"] if ckpt else 0)
        rows.rewind(to)
        return to

    def _time_of(self, step: int) -> float:
        """Seconds on the run's clock when `step` steps were done (0: its start)."""
        if step <= self.first:
            return 0.0
        times = [r["time_s"] for r in self.run.metrics if r["step"] == step - 1]
        return float(times[-1]) if times else 0.0

    def _resume_hint(self, ckpt: Checkpoint | None) -> str:
        if ckpt is None:
            return "no checkpoint was committed yet: start the run again"
        return (f"resume the run from its last checkpoint ({ckpt.path}, step {ckpt.step}) "
                f"with: opdflow run PIPELINE --resume {self.run.path}")  # fmt: skip


def _on(nodes: list[dict[str, Any]]) -> str:
    return ", ".join(f"node {n['node']}" for n in nodes) or "an unknown node"


def _cancel(refs: Any) -> None:
    """Cancel work of the abandoned timeline (queued calls do not run; a running one ends
    on its own and its result is never read)."""
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref)
