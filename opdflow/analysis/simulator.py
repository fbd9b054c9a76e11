"""A discrete-event model of the staged dataflow, to size a cluster before renting it.

Users ask how many rollout workers, which k and how large a batch keep the trainer busy.
`simulate` answers from one measured run: it replays the controller's schedule
(controller.py) with service times resampled from that run's spans and scaled by what
the user changes (generators, batch, response length, learner speed).

The model, stage by stage (every server is FIFO in submission order, like a Ray actor):

- Launch: generation for step s starts once version s - k exists (`launch_version`), with
  the freshest version; its prompts are split across min(G, prompts) chunks, each sent to
  the replica with the fewest unfinished chunks (GeneratorPool.submit).
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
  StepObservation to the policy (the real FixedStaleness / AdaptiveStaleness), launches
  what became launchable, then spends the run's per-step driver overhead (logging).

Contention: by default every stage has its own hardware (a cluster); `cores=C` makes the
busy stages share C cores (processor sharing), as on the small machine a run was
measured on. The held-out evaluator is left out, and generation cost is linear in responses per
chunk (compute-bound decoding, as on the CPU reference); spans keep per-chunk token
totals only, so the empirical length model resamples per-chunk mean lengths.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from opdflow.core.adaptive import AdaptiveStaleness
from opdflow.core.staleness import FixedStaleness, StepObservation, launch_version, within_bound

SATURATED_WAIT_SHARE = 0.02
"""The trainer counts as saturated when it waits at most this share of its step time."""


# ---------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class StageTimes:
    """Service times measured in one run, as samples to resample (seconds)."""

    gen_chunk_s: np.ndarray
    """Seconds of each generator chunk."""
    gen_chunk_responses: np.ndarray
    """Responses in each of those chunks."""
    response_lengths: np.ndarray
    """Response lengths in tokens (per-chunk means: spans keep chunk totals only)."""
    rescorer_s_per_token: np.ndarray
    teacher_s_per_token: np.ndarray
    learner_s_per_token: np.ndarray
    publish_s: np.ndarray
    gen_fetch_s: np.ndarray
    rescorer_fetch_s: np.ndarray
    overhead_s: np.ndarray
    """Driver time per step outside trainer wait, training and publishing (logging, gets)."""
    prompts_per_step: int
    responses_per_prompt: int
    max_new_tokens: int
    warmup_steps: int = 2
    source: str = ""

    @classmethod
    def constant(
        cls,
        gen_s: float,
        train_s: float,
        rescore_s: float = 0.0,
        teacher_s: float = 0.0,
        publish_s: float = 0.0,
        fetch_s: float = 0.0,
        overhead_s: float = 0.0,
        prompts_per_step: int = 1,
        responses_per_prompt: int = 1,
        length: int = 1,
    ) -> StageTimes:
        """Constant times for a step of `prompts_per_step` prompts on one generator (tests)."""
        n = prompts_per_step * responses_per_prompt
        tokens = n * length

        def one(x: float) -> np.ndarray:
            return np.array([float(x)])

        return cls(
            gen_chunk_s=one(gen_s),
            gen_chunk_responses=one(n),
            response_lengths=one(length),
            rescorer_s_per_token=one(rescore_s / tokens),
            teacher_s_per_token=one(teacher_s / tokens),
            learner_s_per_token=one(train_s / tokens),
            publish_s=one(publish_s),
            gen_fetch_s=one(fetch_s),
            rescorer_fetch_s=one(fetch_s),
            overhead_s=one(overhead_s),
            prompts_per_step=prompts_per_step,
            responses_per_prompt=responses_per_prompt,
            max_new_tokens=length,
            warmup_steps=0,
            source="constant",
        )

    @classmethod
    def from_run(cls, run_dir: str | Path) -> StageTimes:
        """From RUN_DIR's spans.parquet, metrics.parquet and config.json (warm-up steps left out)."""
        from opdflow.errors import ConfigError
        from opdflow.runtime.rundir import read_table

        p = Path(run_dir)
        for name in ("spans.parquet", "metrics.parquet", "config.json"):
            if not (p / name).is_file():
                raise ConfigError(
                    f"{p / name} is missing: `opdflow simulate` needs a finished run directory "
                    "with spans (run a pipeline with `opdflow run ... --run-dir DIR` first)"
                )
        cfg = json.loads((p / "config.json").read_text())
        spans, metrics = read_table(p / "spans.parquet"), read_table(p / "metrics.parquet")
        warm = int(cfg.get("warmup_steps", 0))
        steps = {r["step"] for r in metrics}
        keep = {s for s in steps if s >= warm} if len(steps) - warm >= 3 else steps

        def pick(stage: str, actor: str | None = None) -> list[dict]:
            return [
                s
                for s in spans
                if s["stage"] == stage
                and s["step"] in keep
                and (actor is None or s["actor"].split("/")[0] == actor)
            ]

        def secs(rows: list[dict]) -> np.ndarray:
            return np.array([r["end_s"] - r["start_s"] for r in rows], float)

        def per_token(stage: str) -> np.ndarray:
            rows = [r for r in pick(stage) if r["tokens"] > 0]
            return secs(rows) / np.array([r["tokens"] for r in rows], float)

        d, e = cfg["data"], cfg["engine"]
        prompts, rpp = int(d["prompts_per_step"]), int(d["responses_per_prompt"])
        gen = [r for r in pick("generator") if r["tokens"] > 0]
        n_chunk = prompts * rpp / min(int(e["replicas"]), prompts)
        learner = {r["step"]: r["end_s"] - r["start_s"] for r in pick("learner")}
        publish = {r["step"]: r["end_s"] - r["start_s"] for r in pick("publish")}
        overhead = [
            max(m["step_s"] - m["trainer_wait_s"] - learner[m["step"]] - publish[m["step"]], 0.0)
            for m in metrics
            if m["step"] in keep and m["step"] in learner and m["step"] in publish
        ]
        out = cls(
            gen_chunk_s=secs(gen),
            gen_chunk_responses=np.full(len(gen), n_chunk),
            response_lengths=np.array([r["tokens"] / n_chunk for r in gen], float),
            rescorer_s_per_token=per_token("rescorer"),
            teacher_s_per_token=per_token("teacher"),
            learner_s_per_token=per_token("learner"),
            publish_s=secs(pick("publish")),
            gen_fetch_s=secs(pick("fetch", "generator")),
            rescorer_fetch_s=secs(pick("fetch", "rescorer")),
            overhead_s=np.array(overhead or [0.0], float),
            prompts_per_step=prompts,
            responses_per_prompt=rpp,
            max_new_tokens=int(e["max_new_tokens"]),
            warmup_steps=warm,
            source=str(p),
        )
        for name in ("gen_chunk_s", "rescorer_s_per_token", "teacher_s_per_token"):
            if len(getattr(out, name)) == 0:
                raise ConfigError(
                    f"{p}/spans.parquet has no {name.split('_')[0]} spans with tokens"
                )
        if len(out.learner_s_per_token) == 0:
            raise ConfigError(f"{p}/spans.parquet has no learner spans with tokens")
        return out


@dataclass(frozen=True)
class LengthModel:
    """Response lengths in tokens: "empirical" (the run's) or "pareto:ALPHA[:CAP]".

    The Pareto tail keeps the run's mean length and is capped at CAP tokens (default
    max_new_tokens); a smaller ALPHA (> 1) means a heavier tail: a few responses far longer
    than the rest, which hold their whole chunk.
    """

    spec: str
    samples: np.ndarray
    cap: float

    @classmethod
    def parse(cls, spec: str, times: StageTimes) -> LengthModel:
        from opdflow.errors import ConfigError

        parts = spec.strip().split(":")
        if parts[0] == "empirical" and len(parts) == 1:
            return cls("empirical", times.response_lengths, float(times.max_new_tokens))
        try:
            if parts[0] != "pareto" or len(parts) not in (2, 3):
                raise ValueError
            alpha = float(parts[1])
            cap = float(parts[2]) if len(parts) == 3 else float(times.max_new_tokens)
            if not alpha > 1 or not cap >= 1:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"--tail {spec!r} is not allowed: expected 'empirical' or 'pareto:ALPHA[:CAP]' "
                "with ALPHA > 1 (tail heaviness) and CAP >= 1 tokens, e.g. pareto:1.5:64"
            ) from None
        mean = float(np.mean(times.response_lengths))
        xm = mean * (alpha - 1) / alpha
        rng = np.random.default_rng(12345)
        samples = np.clip(xm * (1 + rng.pareto(alpha, 20000)), 1.0, cap)
        return cls(spec, samples, cap)

    def draw(self, rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
        return rng.choice(self.samples, size=n) * scale

    def expected_longest(self, n: int) -> float:
        """Mean of the longest of n draws (scale 1), by quadrature over the sorted samples."""
        return _expected_max(self.samples.tobytes(), n)


@lru_cache(maxsize=256)
def _expected_max(buf: bytes, n: int) -> float:
    x = np.sort(np.frombuffer(buf, dtype=float))
    m = len(x)
    cdf = np.arange(1, m + 1) / m
    weights = cdf**n - np.concatenate([[0.0], cdf[:-1]]) ** n
    return float((weights * x).sum())


# ---------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class SimConfig:
    """One configuration to simulate."""

    generators: int = 1
    """Generator replicas G."""
    k: int | str = 0
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

    def validate(self) -> SimConfig:
        from opdflow.errors import ConfigError

        def bad(name: str, value, allowed: str) -> None:
            raise ConfigError(f"{name}={value!r} is not allowed: expected {allowed}")

        if self.generators < 1:
            bad("generators", self.generators, "an integer >= 1")
        if self.k != "adaptive" and not (isinstance(self.k, int) and self.k >= 0):
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
    decisions: list = field(default_factory=list)
    policy: object = None

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


class _Task:
    """Work on one FIFO server: `work` seconds at full speed, after `deps` are done."""

    __slots__ = ("deps", "done_s", "server", "work")

    def __init__(self, server: str, work: float, deps: tuple = ()):
        self.server, self.work, self.deps = server, max(work, 0.0), deps
        self.done_s: float | None = None


class _Machine:
    """FIFO servers advancing in time; with `cores`, the busy ones share that many cores
    (processor sharing: n busy servers each run at min(1, cores / n) of full speed)."""

    def __init__(self, cores: float | None):
        self.cores, self.now = cores, 0.0
        self.queues: dict[str, list[_Task]] = {}

    def submit(self, task: _Task) -> _Task:
        self.queues.setdefault(task.server, []).append(task)
        return task

    def unfinished(self, server: str) -> int:
        return len(self.queues.get(server, ()))

    def run_until(self, task: _Task) -> None:
        """Advance time until `task` is done."""
        while task.done_s is None:
            busy = [
                q[0]
                for q in self.queues.values()
                if q and all(d.done_s is not None for d in q[0].deps)
            ]
            if not busy:
                raise RuntimeError(f"simulator deadlock waiting for {task.server}")  # a bug
            speed = 1.0 if self.cores is None else min(1.0, self.cores / len(busy))
            dt = min(t.work for t in busy) / speed
            self.now += dt
            for t in busy:
                t.work -= dt * speed
                if t.work <= 1e-12:
                    t.done_s = self.now
                    self.queues[t.server].pop(0)


@dataclass
class _Job:
    version: int
    launched_s: float
    scored: _Task
    tokens: int


class _Dataflow:
    """The generator pool, rescorer and teacher as FIFO servers on a _Machine."""

    def __init__(self, times: StageTimes, cfg: SimConfig, rng: np.random.Generator):
        self.t, self.cfg, self.rng = times, cfg, rng
        self.machine = _Machine(cfg.cores)
        self.lengths = LengthModel.parse(cfg.tail, times)
        measured = LengthModel.parse("empirical", times)  # what the run's chunks really held
        self.gen_rate = times.gen_chunk_s / np.array(
            [n * measured.expected_longest(round(n)) for n in times.gen_chunk_responses]
        )
        self.gen_holds = [0] * cfg.generators  # replicas start holding version 0
        self.rescorer_holds = 0

    def pick(self, a: np.ndarray) -> float:
        return float(a[self.rng.integers(len(a))]) if len(a) else 0.0

    def launch(self, step: int, version: int) -> _Job:
        """Submit step's chunks (least busy replica each), rescore and teacher now."""
        t, cfg, m = self.t, self.cfg, self.machine
        prompts = cfg.prompts_per_step or t.prompts_per_step
        parts = min(cfg.generators, prompts)
        counts = [m.unfinished(f"generator/{j}") for j in range(cfg.generators)]
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
            chunks.append(m.submit(_Task(f"generator/{idx}", work)))
            counts[idx] += 1
            tokens += float(lengths.sum())
        work = self.pick(t.rescorer_s_per_token) * tokens / cfg.scorer_speedup
        if self.rescorer_holds != version:
            work += self.pick(t.rescorer_fetch_s)
            self.rescorer_holds = version
        rescored = m.submit(_Task("rescorer", work, tuple(chunks)))
        work = self.pick(t.teacher_s_per_token) * tokens / cfg.scorer_speedup
        scored = m.submit(_Task("teacher", work, (rescored,)))
        return _Job(version, m.now, scored, round(tokens))


def make_policy(cfg: SimConfig) -> FixedStaleness | AdaptiveStaleness:
    """The real policy object the controller would use for cfg.k."""
    if cfg.k == "adaptive":
        return AdaptiveStaleness(cfg.k_max, cfg.target_wait_share, 0.0, start_k=0)
    return FixedStaleness(int(cfg.k))


def simulate(times: StageTimes, cfg: SimConfig) -> SimResult:
    """Run the controller's schedule for cfg.steps learner steps; see the module docstring."""
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    flow = _Dataflow(times, cfg, rng)
    policy = make_policy(cfg)
    pending: dict[int, _Job] = {}
    latest, next_launch, dropped = 0, 0, 0
    schedule: list[SimStep] = []
    decisions = []
    m = flow.machine

    def launch_ready() -> None:
        nonlocal next_launch
        while next_launch < cfg.steps and launch_version(next_launch, policy.k, latest) is not None:
            pending[next_launch] = flow.launch(next_launch, latest)
            next_launch += 1

    def driver(work: float) -> None:
        m.run_until(m.submit(_Task("driver", work)))

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
            if within_bound(step, job.version, policy.k):
                break
            dropped += 1
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
        if (decision := policy.observe(obs)) is not None:
            decisions.append(decision)
        launch_ready()
        driver(flow.pick(times.overhead_s))
    return _result(cfg, times, schedule, ticks, dropped, decisions, policy)


def _result(cfg, times, schedule, ticks, dropped, decisions, policy) -> SimResult:
    warm = min(times.warmup_steps, max(len(ticks) - 2, 0))
    t_warm = 0.0 if warm == 0 else ticks[warm - 1]
    timed = len(ticks) - warm
    uph = 3600 * timed / (ticks[-1] - t_warm) if timed > 0 and ticks[-1] > t_warm else math.nan
    body = schedule[warm:] or schedule
    busy = sum(s.step_s for s in body)
    stale = [s.step - s.version for s in schedule]
    return SimResult(
        config=cfg,
        updates_per_hour=uph,
        trainer_wait_share=sum(s.wait_s for s in body) / busy if busy > 0 else 0.0,
        mean_staleness=float(np.mean(stale)),
        max_staleness=int(max(stale)),
        dropped=dropped,
        k_final=policy.k,
        k_mean=float(np.mean([s.k for s in schedule])),
        schedule=schedule,
        decisions=decisions,
        policy=policy,
    )


def simulate_mean(times: StageTimes, cfg: SimConfig, replicates: int = 3) -> SimResult:
    """simulate() over `replicates` seeds; the numbers are their means (schedule: the first)."""
    from dataclasses import replace

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
    from dataclasses import replace

    fixed = [k for k in ks if k != "adaptive"]
    k_max = max(fixed, default=base.k_max)
    return [
        simulate_mean(times, replace(base, generators=g, k=k, k_max=k_max), replicates)
        for g in generators
        for k in ks
    ]


def smallest_saturated(
    results: list[SimResult], share: float = SATURATED_WAIT_SHARE
) -> SimResult | None:
    """Fewest generators, then smallest fixed k, whose trainer wait share is <= share."""
    ok = [r for r in results if r.config.k != "adaptive" and r.trainer_wait_share <= share]
    return min(ok, key=lambda r: (r.config.generators, r.config.k), default=None)
