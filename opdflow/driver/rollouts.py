"""The rollouts in flight: each step's batch launched within the staleness bound, awaited.

A step's batch is a chain of ObjectRefs (generator replicas -> rescorer -> teacher) that
flows stage to stage without the driver; `Rollouts` keeps the chain of every launched step
until the learner takes it. It launches a step once core/launch.py's `Launches` allows it
(version step - k exists), hands the controller the next step's batch once scored and
within the bound (a batch that broke it is dropped and its step launched again), lets the
staleness policy see each trained step (k, the generator pool's size), and forgets the
weights versions no batch in flight still needs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from opdflow.cluster.supervisor import Link, await_links
from opdflow.config import PipelineConfig
from opdflow.core.launch import Launches
from opdflow.core.staleness import StepObservation
from opdflow.driver.assembly import Stages
from opdflow.driver.wiring import RunWiring
from opdflow.record.checkpoint import Checkpoint
from opdflow.record.rundir import RunDir


@dataclass
class Pending:
    """One step's batch in flight: the version it is generated at and its chain of links."""

    version: int
    links: list[Link]
    attempt: int = 0
    wait_s: float = 0.0
    """Seconds the driver waited for it (trainer wait), once awaited."""

    @property
    def ref(self) -> Any:
        return self.links[-1].ref


@dataclass
class Rollouts:
    """Every launched step's batch until the learner takes it, under `gate`'s bound."""

    st: Stages
    run: RunDir
    gate: Launches
    timeout_s: float
    """A stage's deadline per batch (reliability.stage_timeout_s)."""
    pending: dict[int, Pending] = dataclasses.field(default_factory=dict)
    watch: Any = None
    """The run's NodeWatch (cluster/nodes.py): told which step the run waits for."""

    @classmethod
    def start(
        cls, cfg: PipelineConfig, run: RunDir, st: Stages, wiring: RunWiring, first: int,
        resume: Checkpoint | None,
    ) -> Rollouts:  # fmt: skip
        """Nothing in flight yet, from step `first` (a resumed run's dropped count kept);
        the wiring's node watch started over what will be."""
        dropped = resume.state["dropped"] if resume else 0
        gate = Launches(st.policy, cfg.train.steps, first, dropped)
        flight = cls(st, run, gate, cfg.reliability.stage_timeout_s)
        flight.watch = wiring.watch_nodes(st.actors, flight.pending)  # node losses: events
        return flight

    def launch(self, step: int, v: int, attempt: int = 0) -> None:
        """Start `step`'s batch at version `v`: generate, rescore, score by the teacher."""
        st = self.st
        weights = st.store.get(v)
        gen = st.pool.submit(st.requests(step, attempt, v), weights, step)
        rescored = st.rescorer.rescore.remote(weights, *[link.ref for link in gen], step=step)
        scored = st.teacher.score.remote(rescored, step)
        links = [*gen, Link("rescorer", st.rescorer, rescored), Link("teacher", st.teacher, scored)]
        self.pending[step] = Pending(weights.version, links, attempt)

    def launch_ready(self) -> None:
        """Launch every step the bound allows now, at the freshest version."""
        for step, v in self.gate.due(self.st.store.latest):
            self.launch(step, v)

    def next_batch(self, step: int, watches: list[Any]) -> Pending:
        """`step`'s batch once scored and within the bound (its `wait_s` set): a batch that
        broke the bound is dropped (an event) and its step launched again. `watches`: refs
        that fail when a learner rank dies (LearnerLost). Launches first what the bound
        allows (after a rewind: the steps from the checkpoint)."""
        self.launch_ready()
        if self.watch is not None:
            self.watch.step = step
        while True:
            job = self.pending.pop(step)
            job.wait_s = await_links(job.links, self.timeout_s, self._on_timeout, watches)
            if self.gate.admit(step, job.version):
                return job
            self.run.event("dropped", step=step, version=job.version, k=self.st.policy.k)
            self.launch(step, self.st.store.latest, job.attempt + 1)

    def _on_timeout(self, stage: str, action: str) -> None:
        self.run.event("timeout", stage=stage, action=action)

    def observe(self, step: int, job: Pending, step_s: float, out: dict[str, Any]) -> None:
        """The staleness policy sees the trained step (it may change k, an event) and the
        generator pool resizes (events)."""
        st, staleness = self.st, step - job.version
        obs = StepObservation(step, job.wait_s, step_s, out["d_stale_k1"], staleness)
        if (decision := st.policy.observe(obs)) is not None:
            self.run.event("staleness", **dataclasses.asdict(decision))
        more = decision is not None and decision.want_more_generators
        for change in st.pool.rescale(more):
            self.run.event("generator_pool", step=step, **change)

    def release_weights(self) -> None:
        """Forget the versions no batch in flight needs; check that no version leaked (one
        would fill memory)."""
        store = self.st.store
        self.st.release_weights(min([p.version for p in self.pending.values()] + [store.latest]))
        store.check_bound(self.st.policy.live_versions)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the launches: batches dropped, the policy's state."""
        return {"dropped": self.gate.dropped, "policy": self.st.policy.state()}
