"""The run's record, step by step: the run clock, each step's metrics row, the restarts.

A trained step becomes one metrics row (what it trained, what it waited, what the weights
and the generator pool hold now) that goes, in step order, to the profiler (which adds
each stage's busy share), the trackers and the caller's `on_step`, once the held-out
evaluation the row carries has finished (`RowQueue`). Restarts of stage actors are polled
once a step and recorded as events. Updates/hour come from the driver's clock after the
warm-up steps (`StepClock`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opdflow.analysis.figures import per_hour
from opdflow.cluster.restarts import RestartLog
from opdflow.config import PipelineConfig
from opdflow.driver.assembly import Stages
from opdflow.driver.rollouts import Pending, Rollouts
from opdflow.driver.wiring import RunWiring
from opdflow.record.rundir import RunDir


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


class StepRecorder:
    """One run's metrics rows, held-out evaluations and restarts, on the run's clock."""

    def __init__(
        self, cfg: PipelineConfig, run: RunDir, st: Stages, wiring: RunWiring, first: int,
        on_step: Callable[[dict], None],
    ):  # fmt: skip
        """Starts the profiler over every stage actor, and with it the run clock."""
        self.cfg, self.run, self.st, self.wiring, self.on_step = cfg, run, st, wiring, on_step
        self.prof = wiring.profiler(st.actors())  # the run clock starts here
        self.rows = RowQueue(self.evaluated, self.emit, first)
        self.clock = StepClock(first, cfg.warmup_steps)
        self.restarts = RestartLog()

    def evaluated(self, version: int) -> bool:
        """Whether `version` is evaluated on the held-out set (eval.every, first, last)."""
        return version == 0 or version % self.cfg.eval.every == 0 or version == self.cfg.train.steps

    def emit(self, row: dict) -> None:
        self.prof.actors["learner"] = self.st.learner  # a new rank 0 once the learner healed
        self.prof.on_step(row)
        self.wiring.trackers.log_metrics(row["step"], row)
        self.on_step(row)

    def evaluate(self, version: int) -> None:
        """Launch the held-out evaluation of a just-published version, if it is evaluated."""
        if self.evaluated(version):
            self.st.evaluate(version)

    def record(
        self, step: int, job: Pending, out: dict[str, Any], timing: tuple[float, float, float],
        flight: Rollouts,
    ) -> None:  # fmt: skip
        """The metrics row of trained `step` (timing: StepClock.tick's), sent on with the
        evaluations finished by now."""
        st, (step_s, uph, elapsed) = self.st, timing
        row = {
            "step": step, "version": job.version, "staleness": step - job.version,
            "k": st.policy.k, **out, "trainer_wait_s": job.wait_s, "step_s": step_s,
            "updates_per_hour": uph, "dropped": flight.gate.dropped, "time_s": elapsed,
            "queue_depth": len(flight.pending),
            "live_weight_versions": len(st.store.live_versions()),
            "weight_bytes_live": st.weight_bytes_live(),
            "generator_replicas": st.pool.status()["ready"],
            "restarts": self.record_restarts(step),
            "checkpoint_block_s": self.wiring.take_checkpoint_block(),
        }  # fmt: skip
        self.rows.push(row, st.collect_evals(self.run, wait=False))

    def record_restarts(self, step: int) -> int:
        """Stage actors restarted since the last poll, each an event; returns how many."""
        hits = self.restarts.poll(self.st.actors(), step)
        for hit in hits:
            self.run.event("restart", **hit)
        return len(hits)

    def flush(self) -> None:
        """Wait for every evaluation launched and send on the rows it held back."""
        self.rows.push(None, self.st.collect_evals(self.run, wait=True))

    def finish(self) -> None:
        """After the last step: every row out, the last restarts (in events and the
        summary only), the profiler's files."""
        self.flush()
        self.record_restarts(self.cfg.train.steps - 1)
        self.prof.actors["learner"] = self.st.learner
        self.prof.finish(self.run)
