"""The controller: wires ObjectRefs between stage actors and enforces the staleness bound.

```
 prompts ──▶ GeneratorPool ──▶ Rescorer ──▶ TeacherScorer ──▶ Learner ──┐
             N engines at v     BF16 at v    logp_teacher      step n    │ version n+1
             (recipe c)         logp_rescore                   AdamW     │ publish
     ▲                                                                   │
     └──────────── WeightStore (versioned refs) ◀──────────────────────────┘
  bound: step n trains on a batch from version v only if n - v <= k (k = 0: synchronous)
```

Generation for step s is launched as soon as version s - k exists, with the freshest
version; batches flow stage to stage as ObjectRefs without touching the driver. The
driver waits only for the batch of the step it trains next: that wait is trainer wait.
A batch whose version broke the bound (k lowered after launch) is dropped and
regenerated, and counted. That rule is core/launch.py's `Launches`, which the simulator
drives too. Dead stage actors are restarted by Ray and their work re-run,
each restart recorded (restarts.py); a stuck one is killed after a deadline
(supervisor.py). A lost learner rank is healed in-run: a new group from the last
checkpoint, the loop rewound to it (healing.py). Checkpoints every N steps (written in the
background, committed once complete) and on SIGINT/SIGTERM make a run resumable; a
finished run leaves its student in final/ (export.py). Stage construction lives in `Stages`
(assembly.py), the run's placement, trackers and checkpoints in `RunWiring` (wiring.py);
connecting to Ray and creating, resuming or cleaning up the run directory is the session's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ray.exceptions import RayError

from opdflow.analysis.figures import per_hour
from opdflow.analysis.summary import summarize
from opdflow.cluster.restarts import RestartLog
from opdflow.cluster.supervisor import (
    LearnerLost,
    Link,
    StageFailed,
    StopRequested,
    await_links,
    stop_on_signals,
)
from opdflow.config import PipelineConfig
from opdflow.core.launch import Launches
from opdflow.core.staleness import StepObservation
from opdflow.driver.assembly import Stages
from opdflow.driver.healing import Healer
from opdflow.driver.wiring import RunInputs, RunWiring
from opdflow.record.checkpoint import Checkpoint
from opdflow.record.rundir import RunDir


@dataclass
class Pending:
    version: int
    links: list[Link]
    attempt: int = 0

    @property
    def ref(self) -> Any:
        return self.links[-1].ref


@dataclass
class StepClock:
    """Step time and updates/hour after `warmup` steps, from the driver's clock (the rate
    is analysis/figures.py's `per_hour`, as the simulator's; the summary, the report and
    the sweep table show the last step's)."""

    first_step: int
    warmup: int
    clock: Callable[[], float] = time.perf_counter
    """Seconds, monotonic; tests pass their own."""

    def __post_init__(self) -> None:
        self.t_start = self.t_prev = self.clock()
        self.t_warm = self.t_start if self.warmup == 0 else None

    def elapsed(self) -> float:
        """Seconds since the run clock started."""
        return self.clock() - self.t_start

    def tick(self, done_steps: int) -> tuple[float, float, float]:
        """(step_s, updates_per_hour, seconds since start) once `done_steps` steps are done."""
        now = self.clock()
        step_s, self.t_prev = now - self.t_prev, now
        timed = done_steps - self.first_step - self.warmup
        if timed == 0:
            self.t_warm = now
        uph = per_hour(timed, now - self.t_warm) if self.t_warm else float("nan")
        return step_s, uph, now - self.t_start


NO_HELDOUT = {"heldout_version": -1, "heldout_kl": float("nan"), "heldout_accuracy": float("nan")}


@dataclass
class RowQueue:
    """Metrics rows held back until the held-out evaluation they carry has finished.

    Row s carries the evaluation of version s + 1 (the weights step s produced); row 0 also
    carries version 0's when version 1 is not evaluated (at eval.every = 1 version 0 is in
    heldout.parquet only). Rows leave in step order, so every sink sees each evaluation at
    its step and steps stay monotonic.
    """

    evaluated: Callable[[int], bool]
    """Whether a version is (or will be) evaluated in this run."""
    emit: Callable[[dict], None]
    first: int = 0
    rows: list[dict] = dataclasses.field(default_factory=list)
    results: dict[int, dict] = dataclasses.field(default_factory=dict)
    carried: dict[int, dict] = dataclasses.field(default_factory=dict)
    """Evaluations already carried by an emitted row (a rewind may need one again)."""

    def version_of(self, step: int) -> int | None:
        if self.evaluated(step + 1):
            return step + 1
        return 0 if step == 0 == self.first else None

    def push(self, row: dict | None, results: dict[int, dict]) -> None:
        """Add a row (None: only results) and the evaluations just collected; emit what's ready."""
        self.results.update(results)
        if row is not None:
            self.rows.append(row)
        while self.rows:
            v = self.version_of(self.rows[0]["step"])
            if v is not None and v not in self.results:
                return
            row = self.rows.pop(0)
            if v is not None:
                self.carried[v] = self.results.pop(v)
            self.emit({**row, **(NO_HELDOUT if v is None else self.carried[v])})

    def rewind(self, step: int) -> None:
        """Back to a checkpoint at `step` (a learner that healed): rows from it are trained
        again, evaluations of later versions belonged to the abandoned timeline."""
        self.rows = [r for r in self.rows if r["step"] < step]
        kept = {**self.carried, **self.results}
        self.results = {v: r for v, r in kept.items() if v <= step}


def run_pipeline(
    cfg: PipelineConfig,
    run: RunDir,
    on_step: Callable[[dict], None] = lambda r: None,
    resume: Checkpoint | None = None,
    on_start: Callable[[Stages], None] = lambda st: None,
    inputs: RunInputs | None = None,
) -> dict:
    """Train cfg.train.steps learner steps (from `resume` if given) in a connected Ray (a
    Session connects it); returns the run summary. `inputs`: what the session read before
    it created the run directory (read here when not given)."""
    inputs = inputs or RunInputs.for_run(cfg, run, resume)
    wiring = RunWiring.open(cfg, run, inputs)  # trackers (params logged once), placement
    trackers = wiring.trackers
    st: Stages | None = None
    try:
        st = Stages.start(cfg, inputs, wiring.placement)
        wiring.check_checkpoint_root(st.learner)
        on_start(st)
        policy, store, rel, steps = st.policy, st.store, cfg.reliability, cfg.train.steps
        first = st.restore(resume, run)
        pending: dict[int, Pending] = {}
        watch = wiring.watch_nodes(st.actors, pending)  # node losses: events, what it waits for
        gate = Launches(policy, steps, first, resume.state["dropped"] if resume else 0)

        def launch(step: int, v: int, attempt: int = 0) -> None:
            weights = store.get(v)
            gen = st.pool.submit(st.requests(step, attempt, v), weights, step)
            refs = [link.ref for link in gen]
            rescored = st.rescorer.rescore.remote(weights, *refs, step=step)
            scored = st.teacher.score.remote(rescored, step)
            links = [
                *gen,
                Link("rescorer", st.rescorer, rescored),
                Link("teacher", st.teacher, scored),
            ]
            pending[step] = Pending(weights.version, links, attempt)

        def launch_ready() -> None:
            for step, v in gate.due(store.latest):
                launch(step, v)

        run.event("weights", **st.transport_event())
        if first == 0:
            st.evaluate(0)
        launch_ready()
        prof = wiring.profiler(st.span_actors())  # the run clock starts here

        def evaluated(version: int) -> bool:
            return version == 0 or version % cfg.eval.every == 0 or version == steps

        def emit(row: dict) -> None:
            prof.on_step(row)
            trackers.log_metrics(row["step"], row)
            on_step(row)

        rows = RowQueue(evaluated, emit, first)
        clock = StepClock(first, cfg.warmup_steps)
        restarts = RestartLog()
        healer = Healer(cfg, run, st, wiring, clock, first)  # a lost learner rank: rewind

        def record_restarts(step: int) -> int:
            hits = restarts.poll(st.actors(), step)
            for hit in hits:
                run.event("restart", **hit)
            return len(hits)

        def on_timeout(stage: str, action: str) -> None:
            run.event("timeout", stage=stage, action=action)

        def checkpoint(step: int) -> None:  # after `step` steps
            state = {"dropped": gate.dropped, "policy": policy.state()}
            wiring.checkpoint(st.learner, state, step, healer.get)

        with stop_on_signals() as stop:
            step = first
            while step < steps:
                watch.step = step
                try:
                    while True:  # trainer wait: the step's batch scored and within the bound
                        job = pending.pop(step)
                        wait_s = await_links(job.links, rel.stage_timeout_s, on_timeout,
                                             healer.watches)  # fmt: skip
                        if gate.admit(step, job.version):
                            break
                        run.event("dropped", step=step, version=job.version, k=policy.k)
                        launch(step, store.latest, job.attempt + 1)
                    out = healer.train(step, job.ref, job.links)
                    store.publish(out.pop("weights"))
                    step_s, uph, elapsed = clock.tick(step + 1)
                    staleness = step - job.version
                    obs = StepObservation(step, wait_s, step_s, out["d_stale_k1"], staleness)
                    if (decision := policy.observe(obs)) is not None:
                        run.event("staleness", **dataclasses.asdict(decision))
                    more = decision is not None and decision.want_more_generators
                    for change in st.pool.rescale(more):
                        run.event("generator_pool", step=step, **change)
                    if out["bad_steps"] > cfg.train.max_bad_steps:
                        raise StageFailed("learner", f"{out['bad_steps']} steps had a non-finite "
                                          f"loss (train.max_bad_steps={cfg.train.max_bad_steps})",
                                          "lower train.lr or check the models")  # fmt: skip
                    launch_ready()
                    st.release_weights(min([p.version for p in pending.values()] + [store.latest]))
                    store.check_bound(policy.live_versions)  # a leaked version would fill memory
                    if evaluated(step + 1):
                        st.evaluate(step + 1)
                    row = {
                        "step": step, "version": job.version, "staleness": staleness,
                        "k": policy.k, **out, "trainer_wait_s": wait_s, "step_s": step_s,
                        "updates_per_hour": uph, "dropped": gate.dropped, "time_s": elapsed,
                        "queue_depth": len(pending),
                        "live_weight_versions": len(store.live_versions()),
                        "weight_bytes_live": st.weight_bytes_live(),
                        "generator_replicas": st.pool.status()["ready"],
                        "restarts": record_restarts(step),
                        "checkpoint_block_s": wiring.take_checkpoint_block(),
                    }  # fmt: skip
                    rows.push(row, st.collect_evals(run, wait=False))
                    if stop.requested or _checkpoint_due(step + 1, rel.checkpoint_every, steps):
                        rows.push(None, st.collect_evals(run, wait=True))
                        checkpoint(step + 1)
                        if stop.requested:
                            wiring.commit_written(st.learner, healer.get, wait=True)
                            raise StopRequested(f"stopped after step {step} (checkpoint "
                                                f"written); resume with --resume {run.path}")  # fmt: skip
                    wiring.commit_written(st.learner, healer.get)  # a checkpoint once complete
                    step += 1
                except (LearnerLost, RayError) as exc:  # anything else is not healed
                    step = healer.heal(exc, step, pending, gate, rows)
                    prof.actors["learner"] = st.learner
                    launch_ready()
        rows.push(None, st.collect_evals(run, wait=True))
        record_restarts(steps - 1)  # after the last row: in events and the summary only
        prof.finish(run)
        checkpoint(steps)
        wiring.commit_written(st.learner, healer.get, wait=True)
        wiring.export_final(steps)
        summary = summarize(run, healer.get(st.learner.record.remote()), gate.dropped, first)
        run.write_json("summary.json", summary)
        return summary
    finally:
        try:
            if st is not None:
                st.shutdown()
        finally:
            wiring.close()


def _checkpoint_due(done: int, every: int, steps: int) -> bool:
    return bool(every) and done % every == 0 and done < steps
