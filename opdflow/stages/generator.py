"""The generator stage: rollout-engine replicas and the pool that routes work to them.

A step's prompt groups are split across replicas (least busy first), each replica getting
all of its share in one call; each replica fetches the weights version it is handed
(a WeightsRef) only when it changes.
The pool keeps between min and max replicas: it adds one when the scheduler asks for more
generation or queued work exceeds the ready replicas, and retires a replica idle for a
grace period. A new replica is created without waiting (on a cluster its resource request
is what makes the autoscaler add a node), loads the newest weights, and gets work only once
ready; a retiring replica gets no new work and is killed only after its in-flight work is
done, so nothing is lost and training never pauses for a resize.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from opdflow.cluster.supervisor import Link
from opdflow.core.actor_name import actor_name
from opdflow.core.rollout import RolloutBatch
from opdflow.engines.base import GenerationRequest, merge_requests
from opdflow.stages.actor import StageActor, pin_threads
from opdflow.stages.specs import GeneratorSpec
from opdflow.weights.version import WeightsRef


class GeneratorWorker(StageActor):
    """One rollout engine replica (a Ray actor)."""

    def __init__(self, spec: GeneratorSpec):
        pin_threads(spec.threads)
        if spec.kind == "vllm":  # vLLM places itself on the GPU(s) Ray gave this actor
            from opdflow.engines.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(spec.model, pad_id=spec.pad_id, eos_id=spec.eos_id,
                                     recipe=spec.recipe, **spec.vllm_options())  # fmt: skip
        else:
            from opdflow.compute.device import stage_device
            from opdflow.engines.torch_engine import TorchEngine

            self.engine = TorchEngine(
                spec.model, spec.pad_id, spec.eos_id, spec.recipe, str(stage_device())
            )
        self.tok = None  # with a tokenizer, batches carry the 0/1 correctness reward
        if spec.tokenizer is not None:
            from opdflow.inputs.grader import make_grader
            from opdflow.inputs.models import load_tokenizer

            self.tok = load_tokenizer(spec.tokenizer)
            self.grader = make_grader(spec.grader, spec.grader_timeout_s)

    def generate(
        self, request: GenerationRequest, weights: WeightsRef, step: int = -1
    ) -> RolloutBatch:
        """Sample `request` with the engine at `weights` (the request's version)."""
        if weights.version != request.version:
            raise ValueError(
                f"a request of version {request.version} came with weights {weights.version}"
            )
        self._ensure(weights, step)
        with self.span("generator", step, request.version) as s:
            batch = self.engine.generate(request)
            s["tokens"] = batch.num_tokens
        if self.tok is not None and any(a is not None for a in batch.answers):
            from opdflow.testbed.task import correctness

            batch.reward_B = correctness(batch, self.tok, self.grader)
        return batch

    def generate_timed(
        self, request: GenerationRequest, weights: WeightsRef, step: int = -1
    ) -> tuple[RolloutBatch, float]:
        """generate() plus its busy seconds (a second, tiny return the pool sizes itself by)."""
        t0 = time.perf_counter()
        batch = self.generate(request, weights, step)
        return batch, time.perf_counter() - t0

    def load(self, weights: WeightsRef) -> int:
        """Fetch a weights version now (a new replica joining); returns the loaded version."""
        self._ensure(weights, -1)
        return self.engine.version

    def _ensure(self, weights: WeightsRef, step: int) -> None:
        """The engine at `weights`: vLLM receives a collective version in its own workers
        (its worker extension), the torch engine here."""
        engine = self.engine
        receiver = engine if hasattr(engine, "pair_owners") else None
        self.ensure_weights(weights, engine.version, step, engine.load_weights,
                            getattr(engine, "device", None), receiver)  # fmt: skip

    def ping(self) -> bool:
        return True


@dataclass
class Replica:
    """One replica as the pool sees it."""

    handle: Any
    ready_ref: Any
    """ObjectRef of the replica's first call; done = the actor is placed and loaded."""
    ready: bool = False
    retiring: bool = False
    inflight: dict = field(default_factory=dict)
    """In-flight batch ref -> its busy-seconds ref."""
    last_busy: float = 0.0
    created: float = 0.0


class GeneratorPool:
    """Driver-side handle on the generator replicas: routing, growth and retirement.

    Sizing, checked once per learner step by `rescale`: add one replica (one pending at a
    time, up to max) when the scheduler asks for more generation, or when more requests
    were queued than replicas were ready while those were busy; retire one (down to min)
    when over the last grace period the others could have done all the work at most
    `SHRINK_UTILISATION` busy, or when a replica was never placed within pending_timeout_s
    and is no longer needed (its resource request is withdrawn). A retiring replica gets no new work and is killed when its
    in-flight requests are done.
    """

    SHRINK_UTILISATION = 0.7
    """Retire a replica when the remaining ones would have been at most this busy."""
    GROW_UTILISATION = 0.5
    """Grow on queued work only when the ready replicas were at least this busy."""

    def __init__(
        self,
        workers: list[Any],
        make_worker: Callable[[], Any] | None = None,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        idle_grace_s: float = 30.0,
        pending_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.clock = clock
        now = clock()
        self.replicas = [Replica(w, w.ping.remote(), last_busy=now, created=now) for w in workers]
        self.make_worker = make_worker
        self.min_replicas = len(workers) if min_replicas is None else min_replicas
        self.max_replicas = len(workers) if max_replicas is None else max_replicas
        self.idle_grace_s = idle_grace_s
        self.pending_timeout_s = pending_timeout_s
        self._latest: WeightsRef | None = None  # the newest version submitted
        self._owner: dict[Any, Replica] = {}  # in-flight batch ref -> replica
        self._busy: list[tuple[float, float]] = []  # (time done, busy seconds) per request
        self._peak_queued = 0
        self._last_change = now

    # ------------------------------------------------------------ state
    @property
    def workers(self) -> list[Any]:
        """Every live replica's actor handle (ready, pending or retiring)."""
        return [r.handle for r in self.replicas]

    def _refresh(self) -> None:
        pending = [r.ready_ref for r in self.replicas if not r.ready]
        done = set(ray.wait(pending, num_returns=len(pending), timeout=0)[0]) if pending else set()
        timing = {t: b for r in self.replicas for b, t in r.inflight.items()}
        finished = ray.wait(list(timing), num_returns=len(timing), timeout=0)[0] if timing else []
        now = self.clock()
        for r in self.replicas:
            if not r.ready and r.ready_ref in done:
                r.ready, r.last_busy = True, now
        for t_ref in finished:
            batch_ref = timing[t_ref]
            rep = self._owner.pop(batch_ref)
            del rep.inflight[batch_ref]
            rep.last_busy = now
            with contextlib.suppress(ray.exceptions.RayError):  # its consumer sees the error
                self._busy.append((now, float(ray.get(t_ref))))
        for r in self.replicas:
            if r.inflight:
                r.last_busy = now

    def _routable(self) -> list[Replica]:
        ready = [r for r in self.replicas if r.ready and not r.retiring]
        # before any replica is ready (start-up), queue on the ones that will be
        return ready or [r for r in self.replicas if not r.retiring]

    def __len__(self) -> int:
        """Replicas that take new work now (what a step's prompts are split across)."""
        self._refresh()
        return len(self._routable())

    def status(self) -> dict[str, int]:
        self._refresh()
        return {
            "ready": sum(r.ready and not r.retiring for r in self.replicas),
            "pending": sum(not r.ready and not r.retiring for r in self.replicas),
            "retiring": sum(r.retiring for r in self.replicas),
            "queued": len(self._owner),
        }

    def busy_seconds(self, window_s: float) -> float:
        """Generation seconds of requests finished within the last window_s seconds."""
        since = self.clock() - window_s
        self._busy = [(t, b) for t, b in self._busy if t >= since]
        return sum(b for _, b in self._busy)

    # ------------------------------------------------------------ work
    def assign(self, requests: list[GenerationRequest]) -> list[tuple[Replica, GenerationRequest]]:
        """Which replica samples what: one step's requests go to distinct replicas, least
        busy first, and a replica given more than one (more requests than replicas) gets
        them merged into one request. Each replica thus gets all of the step's work for it
        in one call, sampled as one batch (vLLM batches and prefix-caches within a call)."""
        targets = sorted(self._routable(), key=lambda r: len(r.inflight))
        share: dict[int, list[GenerationRequest]] = {}
        for i, req in enumerate(requests):
            share.setdefault(i % len(targets), []).append(req)
        return [(targets[t], merge_requests(reqs)) for t, reqs in sorted(share.items())]

    def submit(
        self, requests: list[GenerationRequest], weights: WeightsRef, step: int = -1
    ) -> list[Link]:
        """Launch one step's requests (see `assign`), sampled at `weights` (their version);
        returns one Link per replica used."""
        self._refresh()
        if requests:
            self._latest = weights
        links = []
        for rep, req in self.assign(requests):
            batch_ref, t_ref = rep.handle.generate_timed.options(num_returns=2).remote(
                req, weights, step
            )
            rep.inflight[batch_ref] = t_ref
            rep.last_busy = self.clock()
            self._owner[batch_ref] = rep
            links.append(
                Link(actor_name("generator", self.replicas.index(rep)), rep.handle, batch_ref)
            )
        self._peak_queued = max(self._peak_queued, len(self._owner))
        return links

    # ------------------------------------------------------------ size
    def rescale(self, want_more: bool = False) -> list[dict[str, Any]]:
        """Resize by at most one replica and remove retired ones whose work is done.

        Returns what changed, as events for the run's log."""
        self._refresh()
        events: list[dict[str, Any]] = []
        now = self.clock()
        active = [r for r in self.replicas if not r.retiring]
        ready = [r for r in active if r.ready]
        pending = [r for r in active if not r.ready]
        window = max(self.idle_grace_s, 1e-9)
        since_change = now - self._last_change
        util = self.busy_seconds(window) / (window * max(len(ready), 1))
        peak, self._peak_queued = self._peak_queued, len(self._owner)
        # queued work beyond the ready replicas, while they are busy (or before any finished)
        backlog = peak > len(ready) and (util >= self.GROW_UTILISATION or not self._busy)
        can_add = self.make_worker is not None and len(active) < self.max_replicas
        if (want_more or backlog) and can_add and not pending:
            events.append(self._add("scheduler" if want_more else f"queued {peak}"))
        elif len(active) > self.max_replicas:  # shrink to max: pending, then least loaded
            victim = min(active, key=lambda r: (r.ready, len(r.inflight)))
            events.append(self._retire(victim, "above max_replicas"))
        elif len(active) > self.min_replicas:
            waited = [r for r in pending if now - r.created >= self.pending_timeout_s]
            if waited and peak <= len(ready):  # never placed, and no longer needed
                events.append(
                    self._retire(waited[0], f"not ready after {now - waited[0].created:.0f}s")
                )
            elif (
                since_change >= window
                and len(ready) > 1
                and util * len(ready) / (len(ready) - 1) <= self.SHRINK_UTILISATION
            ):
                victim = min(ready, key=lambda r: (len(r.inflight), r.last_busy))
                events.append(self._retire(victim, f"utilisation {util:.2f}"))
        for r in [r for r in self.replicas if r.retiring and not r.inflight]:
            ray.kill(r.handle)
            self.replicas.remove(r)
            events.append({"action": "removed"})
        for e in events:
            e.update(self.status())
        return events

    def _retire(self, replica: Replica, reason: str) -> dict[str, Any]:
        replica.retiring = True
        self._last_change = self.clock()
        return {"action": "retire", "reason": reason}

    def _add(self, reason: str) -> dict[str, Any]:
        assert self.make_worker is not None
        handle = self.make_worker()
        first = handle.load.remote(self._latest) if self._latest else handle.ping.remote()
        now = self.clock()
        self.replicas.append(Replica(handle, first, last_busy=now, created=now))
        self._last_change = self.clock()
        return {"action": "add", "reason": reason}
