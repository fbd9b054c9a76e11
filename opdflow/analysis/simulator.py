"""A discrete-event model of the staged dataflow, to size a cluster before renting it.

Users ask how many rollout workers, which k and how large a batch keep the trainer busy.
`simulate` answers from one measured run: it replays the controller's schedule
(controller.py) with service times resampled from that run's spans and scaled by what
the user changes (generators, batch, response length, learner speed).

The model, stage by stage (every server is FIFO in submission order, like a Ray actor):

- Launch: generation for step s starts once version s - k exists, with the freshest
  version (core/launch.py's `Launches`, the controller's own rule); its prompts are split
  across min(G, prompts) chunks, each sent to the replica with the fewest unfinished
  chunks (GeneratorPool.submit).
- Generator replica: a fetch when the chunk's version is not the one it holds, then the
  chunk. A chunk's time is driven by its longest response (batched decoding runs until
  the last response ends): rate x responses x longest length, with the rate resampled
  from the run (its chunk seconds / (responses x expected longest length there)) and the
  lengths drawn per response from a LengthModel (long tails: `pareto:ALPHA`).
- Rescorer (fetch on a version change, then seconds/token x the step's tokens), teacher
  (seconds/token x tokens), both divided by the scorer speedup: after every chunk of the
  step is done.
- Learner (driver loop): waits for step n's scored batch (trainer wait); a batch outside
  the bound (k lowered since launch) is dropped and regenerated; trains (seconds/token x
  tokens / learner speedup), publishes (resampled publish time) version n + 1, reports a
  StepObservation to the policy (the real one, core/policy.py's `make_policy`), launches
  what became launchable, then spends the run's per-step driver overhead (logging).

Contention: by default every stage has its own hardware (a cluster); `cores=C` makes the
busy stages share C cores (processor sharing, machine.py), as on the small machine a run
was measured on. The held-out evaluator is left out, and generation cost is linear in
responses per chunk (compute-bound decoding, as on the CPU reference); spans keep
per-chunk token totals only, so the empirical length model (lengths.py) resamples
per-chunk mean lengths. Stage times come from stage_times.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from opdflow.analysis.figures import mean, per_hour, timed_from, wait_share
from opdflow.analysis.lengths import LengthModel
from opdflow.analysis.machine import Machine, Task
from opdflow.analysis.stage_times import StageTimes
from opdflow.config import StalenessConfig
from opdflow.core.actor_name import actor_name
from opdflow.core.launch import Launches
from opdflow.core.policy import ADAPTIVE, KToken, make_policy, settings_for, sweep_k_max
from opdflow.core.staleness import Decision, StalenessPolicy, StepObservation
from opdflow.errors import ConfigError

SATURATED_WAIT_SHARE = 0.02
"""The trainer counts as saturated when it waits at most this share of its step time."""


@dataclass(frozen=True)
class SimConfig:
    """One configuration to simulate."""

    generators: int = 1
    """Generator replicas G."""
    k: KToken = 0
    """Staleness bound, or "adaptive" (AdaptiveStaleness starting at 0, up to k_max)."""
    k_max: int = 8
    """Largest k of the adaptive policy."""
    steps: int = 200
    """Learner steps simulated."""
    prompts_per_step: int | None = None
    """Prompts per step (None: the run's)."""
    response_length_scale: float = 1.0
    """Multiplies every response length (and the cap)."""
    learner_speedup: float = 1.0
    """Divides the learner's time per token."""
    scorer_speedup: float = 1.0
    """Divides the rescorer's and teacher's time per token (on a GPU a scoring prefill costs
    far less per token than decoding; on the CPU reference they cost about the same)."""
    tail: str = "empirical"
    """Response-length model: "empirical" or "pareto:ALPHA[:CAP]" (LengthModel)."""
    target_wait_share: float = SATURATED_WAIT_SHARE
    """The adaptive policy's target trainer wait share."""
    cores: float | None = None
    """Cores shared by every stage (processor sharing), as on one small machine; None: each
    stage has its own hardware (a cluster)."""
    seed: int = 0
    """Seed of the resampled stage times and response lengths."""

    @property
    def staleness(self) -> StalenessConfig:
        """The run's staleness settings this configuration stands for (no d_stale budget:
        the simulator does not model d_stale)."""
        return settings_for(
            self.k, StalenessConfig(target_wait_share=self.target_wait_share), self.k_max
        )

    def validate(self) -> SimConfig:
        def bad(name: str, value, allowed: str) -> None:
            raise ConfigError(f"{name}={value!r} is not allowed: expected {allowed}")

        if self.generators < 1:
            bad("generators", self.generators, "an integer >= 1")
        if self.k != ADAPTIVE and not (isinstance(self.k, int) and self.k >= 0):
            bad("k", self.k, "an integer >= 0 or 'adaptive'")
        if self.steps < 1:
            bad("steps", self.steps, "an integer >= 1")
        if self.prompts_per_step is not None and self.prompts_per_step < 1:
            bad("batch", self.prompts_per_step, "prompts per step >= 1")
        if not self.response_length_scale > 0:
            bad("response_length_scale", self.response_length_scale, "a number > 0")
        if self.cores is not None and not self.cores > 0:
            bad("cores", self.cores, "a number > 0 or None")
        if not self.learner_speedup > 0:
            bad("learner_speedup", self.learner_speedup, "a number > 0")
        if not self.scorer_speedup > 0:
            bad("scorer_speedup", self.scorer_speedup, "a number > 0")
        return self


@dataclass(frozen=True)
class SimStep:
    """One simulated learner step (times in simulated seconds since start)."""

    step: int
    version: int
    k: int
    launched_s: float
    ready_s: float
    train_start_s: float
    train_end_s: float
    wait_s: float
    step_s: float


@dataclass
class SimResult:
    """What one configuration gave."""

    config: SimConfig
    updates_per_hour: float
    trainer_wait_share: float
    mean_staleness: float
    max_staleness: int
    dropped: int
    k_final: int
    k_mean: float
    schedule: list[SimStep] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    observations: list[StepObservation] = field(default_factory=list)
    """What each step reported to the policy, in step order (as a run's metrics hold it)."""
    policy: StalenessPolicy | None = None

    def row(self) -> dict:
        c = self.config
        return {
            "generators": c.generators,
            "k": c.k,
            "prompts_per_step": c.prompts_per_step,
            "updates_per_hour": self.updates_per_hour,
            "trainer_wait_share": self.trainer_wait_share,
            "mean_staleness": self.mean_staleness,
            "max_staleness": self.max_staleness,
            "dropped": self.dropped,
            "k_final": self.k_final,
            "k_mean": self.k_mean,
        }


@dataclass
class Job:
    """One launch of a step: its version, when it started, its teacher task, its tokens."""

    version: int
    launched_s: float
    scored: Task
    tokens: int


class Dataflow:
    """The generator pool, rescorer and teacher as FIFO servers on a Machine."""

    def __init__(self, times: StageTimes, cfg: SimConfig, rng: np.random.Generator):
        self.t, self.cfg, self.rng = times, cfg, rng
        self.machine = Machine(cfg.cores)
        self.lengths = LengthModel.parse(cfg.tail, times)
        measured = LengthModel.parse("empirical", times)  # what the run's chunks really held
        self.gen_rate = times.gen_chunk_s / np.array(
            [n * measured.expected_longest(round(n)) for n in times.gen_chunk_responses]
        )
        self.gen_holds = [0] * cfg.generators  # replicas start holding version 0
        self.rescorer_holds = 0

    def pick(self, a: np.ndarray) -> float:
        return float(a[self.rng.integers(len(a))]) if len(a) else 0.0

    def launch(self, step: int, version: int) -> Job:
        """Submit step's chunks (least busy replica each), rescore and teacher now."""
        t, cfg, m = self.t, self.cfg, self.machine
        prompts = cfg.prompts_per_step or t.prompts_per_step
        parts = min(cfg.generators, prompts)
        counts = [m.unfinished(actor_name("generator", j)) for j in range(cfg.generators)]
        chunks, tokens = [], 0.0
        for i in range(parts):
            n = len(range(i, prompts, parts)) * t.responses_per_prompt
            idx = min(range(cfg.generators), key=lambda j: counts[j])
            work = 0.0
            if self.gen_holds[idx] != version:  # FIFO: the replica holds its last chunk's version
                work += self.pick(t.gen_fetch_s)
                self.gen_holds[idx] = version
            lengths = self.lengths.draw(self.rng, n, cfg.response_length_scale)
            work += self.pick(self.gen_rate) * n * float(lengths.max())
            chunks.append(m.submit(Task(actor_name("generator", idx), work)))
            counts[idx] += 1
            tokens += float(lengths.sum())
        work = self.pick(t.rescorer_s_per_token) * tokens / cfg.scorer_speedup
        if self.rescorer_holds != version:
            work += self.pick(t.rescorer_fetch_s)
            self.rescorer_holds = version
        rescored = m.submit(Task("rescorer", work, tuple(chunks)))
        work = self.pick(t.teacher_s_per_token) * tokens / cfg.scorer_speedup
        scored = m.submit(Task("teacher", work, (rescored,)))
        return Job(version, m.now, scored, round(tokens))


def simulate(times: StageTimes, cfg: SimConfig) -> SimResult:
    """Run the controller's schedule for cfg.steps learner steps; see the module docstring."""
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    flow = Dataflow(times, cfg, rng)
    policy = make_policy(cfg.staleness)
    gate = Launches(policy, cfg.steps)
    pending: dict[int, Job] = {}
    latest = 0
    schedule: list[SimStep] = []
    decisions, observations = [], []
    m = flow.machine

    def launch_ready() -> None:
        for step, version in gate.due(latest):
            pending[step] = flow.launch(step, version)

    def driver(work: float) -> None:
        m.run_until(m.submit(Task("driver", work)))

    launch_ready()
    prev_tick, ticks = m.now, []
    for step in range(cfg.steps):
        wait_total = 0.0
        while True:
            job = pending.pop(step)
            t0 = m.now
            m.run_until(job.scored)
            wait_s = m.now - t0
            wait_total += wait_s
            if gate.admit(step, job.version):
                break
            pending[step] = flow.launch(step, latest)
        train_start = m.now
        driver(flow.pick(times.learner_s_per_token) * job.tokens / cfg.learner_speedup)
        driver(flow.pick(times.publish_s))
        latest = step + 1
        step_s, prev_tick = m.now - prev_tick, m.now
        ticks.append(m.now)
        times_s = (job.launched_s, job.scored.done_s, train_start, m.now, wait_total, step_s)
        schedule.append(SimStep(step, job.version, policy.k, *times_s))
        obs = StepObservation(step, wait_s, step_s, float("nan"), step - job.version)
        observations.append(obs)
        if (decision := policy.observe(obs)) is not None:
            decisions.append(decision)
        launch_ready()
        driver(flow.pick(times.overhead_s))
    return _result(cfg, times, schedule, ticks, gate.dropped, decisions, policy, observations)


def _result(cfg, times, schedule, ticks, dropped, decisions, policy, observations) -> SimResult:
    # the figures a measured run's summary shows, by figures.py's definitions: updates/hour
    # and trainer wait share after warm-up (the clock restarts at the warm-up's last tick)
    warm = timed_from(len(ticks), times.warmup_steps)
    t_warm = 0.0 if warm == 0 else ticks[warm - 1]
    body = schedule[warm:]
    stale = [s.step - s.version for s in schedule]
    wait = wait_share([s.wait_s for s in body], [s.step_s for s in body])
    return SimResult(
        config=cfg,
        updates_per_hour=per_hour(len(ticks) - warm, ticks[-1] - t_warm) if ticks else math.nan,
        trainer_wait_share=0.0 if math.isnan(wait) else wait,
        mean_staleness=mean(stale),
        max_staleness=int(max(stale)),
        dropped=dropped,
        k_final=policy.k,
        k_mean=mean([s.k for s in schedule]),
        schedule=schedule,
        decisions=decisions,
        observations=observations,
        policy=policy,
    )


def simulate_mean(times: StageTimes, cfg: SimConfig, replicates: int = 3) -> SimResult:
    """simulate() over `replicates` seeds; the numbers are their means (schedule: the first)."""
    runs = [simulate(times, replace(cfg, seed=cfg.seed + i)) for i in range(max(replicates, 1))]
    first = runs[0]
    for key in ("updates_per_hour", "trainer_wait_share", "mean_staleness", "k_mean"):
        setattr(first, key, float(np.mean([getattr(r, key) for r in runs])))
    first.max_staleness = max(r.max_staleness for r in runs)
    first.dropped = round(float(np.mean([r.dropped for r in runs])))
    return first


def grid(
    times: StageTimes, generators: list[int], ks: list, base: SimConfig, replicates: int = 3
) -> list[SimResult]:
    """Every (G, k) pair; "adaptive" uses k_max = the largest fixed k given."""
    k_max = sweep_k_max(ks, base.k_max)
    return [
        simulate_mean(times, replace(base, generators=g, k=k, k_max=k_max), replicates)
        for g in generators
        for k in ks
    ]


def smallest_saturated(
    results: list[SimResult], share: float = SATURATED_WAIT_SHARE
) -> SimResult | None:
    """Fewest generators, then smallest fixed k, whose trainer wait share is <= share."""
    ok = [r for r in results if r.config.k != ADAPTIVE and r.trainer_wait_share <= share]
    return min(ok, key=lambda r: (r.config.generators, r.config.k), default=None)
