"""The profiler: spans of every stage, per-step busy shares, a trace file, live Ray metrics.

Actors time their own work (`SpanRecorder.span`: one time.time() and two perf_counter()
calls and a list append per span) and keep the spans until the driver drains them with a
non-blocking call each step. The driver turns them into spans.parquet and trace.json
(Chrome/Perfetto trace events) and fills per-step columns of metrics.parquet.

Clock: an actor stamps a span's start with its wall clock (time.time(), epoch seconds)
and measures the duration with perf_counter; the driver subtracts the wall-clock epoch it
read when the run's loop started, so start_s/end_s are seconds since run start on the
driver's clock. On one machine the clocks are the same; across nodes this relies on the
nodes' clocks being synchronised (NTP: typically within a millisecond).

Stages: generator | rescorer | teacher | learner | evaluator (the work itself), publish
(what the learner's publish call blocks: the FP32 -> BF16 cast on a sharded learner, else
only its start; a cast beside the next step, the put or the sends run on, and the next
learner span holds its wait for the cast), fetch (an actor's get or receive + load of a
version it did not hold). Nothing heavy is imported at module import.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opdflow.core.actor_name import stage_of

STAGES = ("generator", "rescorer", "teacher", "learner", "evaluator", "publish", "fetch")
"""Every span's stage."""
ACTOR_KINDS = ("generator", "rescorer", "teacher", "learner", "evaluator")
"""Actors are named as core/actor_name.py says (KIND or KIND[INDEX]); busy shares are per
kind."""

STEP_COLUMNS = (*(f"busy_share_{kind}" for kind in ACTOR_KINDS), "fetch_s", "fetch_bytes")
"""The metrics columns step_columns fills: live estimates when a step is logged (spans still
in flight are missing), recomputed exactly in metrics.parquet when the run finishes."""


@dataclass(frozen=True)
class Span:
    """One piece of work of one actor (a row of spans.parquet)."""

    stage: str
    actor: str
    step: int
    """Learner step the work served; -1 if none (held-out evaluation, initial publish)."""
    version: int
    """Weights version the work used (or produced, for publish)."""
    start_s: float
    """Seconds since run start, driver clock."""
    end_s: float
    tokens: int = 0
    bytes: int = 0

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


class SpanRecorder:
    """Mixin for stage actors: `with self.span(stage, step, version) as s: ...; s["tokens"] = n`."""

    wall_clock = staticmethod(time.time)
    """Span starts, as epoch seconds (tests substitute their own clocks)."""
    duration_clock = staticmethod(time.perf_counter)
    """Span durations (monotonic)."""

    @contextlib.contextmanager
    def span(self, stage: str, step: int = -1, version: int = -1) -> Iterator[dict[str, int]]:
        extra = {"tokens": 0, "bytes": 0}
        t_epoch, t0 = self.wall_clock(), self.duration_clock()
        try:
            yield extra
        finally:
            seconds = self.duration_clock() - t0
            self.add_span(stage, step, version, t_epoch, seconds, extra["tokens"], extra["bytes"])

    def add_span(
        self,
        stage: str,
        step: int,
        version: int,
        t_epoch: float,
        seconds: float,
        tokens: int = 0,
        nbytes: int = 0,
    ) -> None:
        """Record a span timed by the caller (start as time.time(), duration in seconds)."""
        spans = self.__dict__.setdefault("_spans", [])
        spans.append((stage, step, version, t_epoch, seconds, int(tokens), int(nbytes)))

    def drain_spans(self) -> list[tuple]:
        """Spans recorded since the last drain: (stage, step, version, epoch_s, seconds,
        tokens, bytes)."""
        spans, self.__dict__["_spans"] = self.__dict__.get("_spans", []), []
        return spans


def to_span(raw: tuple, actor: str, epoch0: float) -> Span:
    """An actor's raw span on the driver's run clock."""
    stage, step, version, t_epoch, seconds, tokens, nbytes = raw
    start = t_epoch - epoch0
    return Span(stage, actor, int(step), int(version), start, start + seconds, tokens, nbytes)


# ---------------------------------------------------------------- pure summaries


def union_seconds(
    intervals: list[tuple[float, float]], a: float = -math.inf, b: float = math.inf
) -> float:
    """Length of the union of possibly overlapping [start, end) intervals, inside [a, b]."""
    total, cur_a, cur_b = 0.0, None, None
    for s, e in sorted((max(s, a), min(e, b)) for s, e in intervals if e > a and s < b):
        if cur_b is None or s > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = s, e
        else:
            cur_b = max(cur_b, e)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def step_columns(spans: list[Span], a: float, b: float, actors: list[str]) -> dict[str, float]:
    """Per-step profiler columns for the step that ran over [a, b] (run clock).

    busy_share_KIND: share of [a, b] the actors of KIND were busy (any of their spans,
    fetch/publish included), averaged over the actors of that kind; fetch_s / fetch_bytes:
    weight fetches that started in [a, b], summed over actors.
    """
    out: dict[str, float] = {}
    length = max(b - a, 1e-12)
    by_actor: dict[str, list[tuple[float, float]]] = {x: [] for x in actors}
    fetch_s, fetch_bytes = 0.0, 0
    for s in spans:
        if s.end_s > a and s.start_s < b:
            by_actor.setdefault(s.actor, []).append((s.start_s, s.end_s))
        if s.stage == "fetch" and a <= s.start_s < b:
            fetch_s += s.seconds
            fetch_bytes += s.bytes
    for kind in ACTOR_KINDS:
        members = [x for x in by_actor if stage_of(x) == kind]
        shares = [union_seconds(by_actor[x], a, b) / length for x in members]
        out[f"busy_share_{kind}"] = sum(shares) / len(shares) if shares else float("nan")
    out["fetch_s"] = fetch_s
    out["fetch_bytes"] = fetch_bytes
    return out


def chrome_trace(spans: list[Span]) -> dict[str, Any]:
    """Chrome/Perfetto trace events: one thread per actor, one complete event per span."""

    def order(actor: str) -> tuple[int, str]:
        kind = stage_of(actor)
        return (ACTOR_KINDS.index(kind) if kind in ACTOR_KINDS else len(ACTOR_KINDS), actor)

    actors = sorted({s.actor for s in spans}, key=order)
    tid = {a: i + 1 for i, a in enumerate(actors)}
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "opdflow run"}}
    ]
    events += [
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[a], "args": {"name": a}}
        for a in actors
    ]
    for s in sorted(spans, key=lambda s: s.start_s):
        events.append(
            {
                "name": s.stage if s.step < 0 else f"{s.stage} step {s.step}",
                "cat": s.stage,
                "ph": "X",
                "pid": 1,
                "tid": tid[s.actor],
                "ts": round(s.start_s * 1e6, 3),
                "dur": round(max(s.seconds, 0.0) * 1e6, 3),
                "args": {
                    "step": s.step,
                    "version": s.version,
                    "tokens": s.tokens,
                    "bytes": s.bytes,
                },
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_spans(path: Path, spans: list[Span]) -> None:
    """spans.parquet and trace.json in the directory `path` (atomic replace)."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("stage", pa.string()),
            ("actor", pa.string()),
            ("step", pa.int64()),
            ("version", pa.int64()),
            ("start_s", pa.float64()),
            ("end_s", pa.float64()),
            ("tokens", pa.int64()),
            ("bytes", pa.int64()),
        ]
    )
    table = pa.Table.from_pylist([asdict(s) for s in spans], schema=schema)
    tmp = path / ".spans.parquet.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path / "spans.parquet")
    tmp = path / ".trace.json.tmp"
    tmp.write_text(json.dumps(chrome_trace(spans)))
    os.replace(tmp, path / "trace.json")


# ---------------------------------------------------------------- the driver side


class LiveMetrics:
    """Ray metrics (Prometheus / Ray dashboard) set by the driver after each step."""

    def __init__(self, run_name: str):
        from ray.util.metrics import Counter, Gauge

        tags = ("run",)
        self._tags = {"run": run_name}
        self._gauges = {
            key: Gauge(f"opdflow_{key}", description=desc, tag_keys=tags)
            for key, desc in (
                ("trainer_wait_s", "Seconds the learner waited for its last batch"),
                ("updates_per_hour", "Learner steps per wall hour after warm-up"),
                ("queue_depth", "Batches launched but not yet trained"),
                ("staleness_k", "Staleness bound k in effect"),
            )
        }
        self._steps = Counter("opdflow_learner_steps", description="Learner steps", tag_keys=tags)

    def update(self, row: dict[str, Any]) -> None:
        for key, gauge in self._gauges.items():
            value = row.get("k" if key == "staleness_k" else key)
            if value is not None and math.isfinite(float(value)):
                gauge.set(float(value), tags=self._tags)
        self._steps.inc(1.0, tags=self._tags)


class Profiler:
    """Driver side: drains actors' spans without blocking, fills step columns, writes files."""

    def __init__(
        self, run_dir: Path, actors: dict[str, Any], run_name: str = "opd", write_every: int = 10
    ):
        self.path = Path(run_dir)
        self.actors = dict(actors)  # label -> actor handle with drain_spans()
        self.epoch0 = time.time()
        self.spans: list[Span] = []
        self._inflight: dict[Any, str] = {}
        self.write_every = write_every
        self._rows = 0
        try:
            self.live: LiveMetrics | None = LiveMetrics(run_name)
        except Exception:  # metrics are a convenience: a run never fails for them
            self.live = None

    def now(self) -> float:
        """Seconds since run start on the driver's clock."""
        return time.time() - self.epoch0

    def poll(self, wait: bool = False) -> None:
        """Collect finished drains; ask every actor without a pending drain for its spans."""
        import ray

        if self._inflight:
            ready, _ = ray.wait(
                list(self._inflight),
                num_returns=len(self._inflight),
                timeout=None if wait else 0,
            )
            for ref in ready:
                label = self._inflight.pop(ref)
                try:
                    raw = ray.get(ref)
                except ray.exceptions.RayError:  # the actor died: its unsent spans are lost
                    continue
                self.spans += [to_span(r, label, self.epoch0) for r in raw]
        if not wait:
            busy = set(self._inflight.values())
            for label, actor in self.actors.items():
                if label not in busy:
                    self._inflight[actor.drain_spans.remote()] = label

    def on_step(self, row: dict[str, Any]) -> None:
        """Add profiler columns to a metrics row (spans still in flight fill in at finish)."""
        self.poll()
        end = row["time_s"]
        row.update(step_columns(self.spans, end - row["step_s"], end, list(self.actors)))
        if self.live is not None:
            self.live.update(row)
        self._rows += 1
        if self.write_every and self._rows % self.write_every == 0:
            write_spans(self.path, self.spans)

    def finish(self, run: Any) -> None:
        """Drain everything, recompute every metrics row's columns exactly (rewriting
        metrics.parquet of the RunDir `run`), write the span files."""
        self.poll(wait=True)  # drains asked for earlier
        self.poll()  # a fresh drain of every actor, now that all work is done
        self.poll(wait=True)
        for row in run.metrics:
            end = row["time_s"]
            row.update(step_columns(self.spans, end - row["step_s"], end, list(self.actors)))
        if run.metrics:
            run.rewrite_metrics()
        write_spans(self.path, self.spans)
