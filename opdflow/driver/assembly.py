"""Stages: builds every actor of a run from its config and holds what the controller uses.

Kept apart from the controller so the dataflow there stays one screen: here are the
details of prompts, the staleness policy and held-out evaluation. Each actor is built from
its spec (stages/specs.py: `StageSpecs`, made once from the pipeline config) with the Ray
options `Placement.options(stage)` gives. The
runtime the actors live in (Ray, placement groups, checkpoints, trackers, the profiler)
is wired by the session and wiring.py and handed in; nothing here connects or places.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError

from opdflow.cluster.placement import Placement
from opdflow.cluster.supervisor import StageFailed
from opdflow.config import PipelineConfig
from opdflow.core.actor_name import actor_name, stage_of
from opdflow.core.policy import make_policy
from opdflow.core.staleness import StalenessPolicy
from opdflow.driver.wiring import RunInputs
from opdflow.engines.base import GenerationRequest, SamplingParams
from opdflow.inputs.data import PromptSampler, PromptSet
from opdflow.record.checkpoint import Checkpoint
from opdflow.record.rundir import RunDir
from opdflow.stages.specs import LearnerSpec, StageSpecs
from opdflow.weights.store import WeightStore
from opdflow.weights.transport import ObjectStore, Transport, for_pipeline


def learner_slots(cfg: PipelineConfig, placement: Placement) -> list[Any]:
    """Where each learner rank goes: its placement-group bundle, or None (anywhere)."""
    return [placement.scheduling("learner") for _ in range(cfg.resources.learner.workers)]


def make_learner(
    spec: LearnerSpec, placement: Placement, slots: list[Any], timeline: int = 0
) -> Any:
    """The learner actor: rank 0 of len(slots) ranks, each placed by its slot (a scheduling
    strategy or None); rank 0 starts the others. `timeline`: the group's number in the run
    (0; one more each time the learner heals)."""
    from opdflow.stages.learner_actor import learner_class

    peers = [placement.options("learner", where) for where in slots[1:]]
    lead = placement.options("learner", slots[0])
    return _actor(learner_class(), lead, spec.with_workers(len(slots)), peers, timeline=timeline)


def _actor(cls: Any, options: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """An actor of `cls` (a plain class, or one already wrapped by ray.remote)."""
    remote = cls if hasattr(cls, "remote") else ray.remote(cls)
    return remote.options(**options).remote(*args, **kwargs)


@dataclass
class Stages:
    """Every actor and helper one run uses."""

    cfg: PipelineConfig
    pool: Any
    rescorer: Any
    teacher: Any
    learner: Any
    evaluator: Any
    train_set: PromptSet
    heldout_set: PromptSet
    sampler: PromptSampler
    sampling: SamplingParams
    policy: StalenessPolicy
    specs: StageSpecs
    """What each actor was built from (a healed learner group is built from it again)."""
    store: WeightStore = field(default_factory=WeightStore)
    evals: dict[int, Any] = field(default_factory=dict)
    transport: Transport = field(default_factory=ObjectStore)
    """What weights.* parsed into (weights.transport.for_pipeline)."""
    learner_slots: list[Any] = field(default_factory=list)
    """Where the learner's ranks were placed (learner_slots): a healed group reuses them."""
    learner_held: dict[str, Any] | None = None
    """collective: what the learner held after the last release (LearnerActor.held) and
    the versions it was told were still needed then ("needed")."""

    @classmethod
    def start(cls, cfg: PipelineConfig, inputs: RunInputs, placement: Placement) -> Stages:
        """Every actor, started on the run's placement groups from the models and prompts
        the session read (RunInputs); returns once each runs (else StageFailed)."""
        from opdflow.stages.evaluator import EvaluatorActor
        from opdflow.stages.generator import GeneratorPool, GeneratorWorker
        from opdflow.stages.rescorer import RescorerActor
        from opdflow.stages.teacher import TeacherActor

        tok, e, opts = inputs.tokenizer, cfg.engine, placement.options
        specs = StageSpecs.of(cfg, inputs.models, tok)  # every actor's config, made once

        def make_worker() -> Any:
            return _actor(GeneratorWorker, opts("generator"), specs.generator)

        workers = [make_worker() for _ in range(e.replicas)]
        slots = learner_slots(cfg, placement)
        st = cls(
            cfg=cfg,
            pool=GeneratorPool(
                workers, make_worker, e.min_replicas, e.max_replicas, e.scale_down_idle_s
            ),
            rescorer=_actor(RescorerActor, opts("rescorer"), specs.rescorer),
            teacher=_actor(TeacherActor, opts("teacher"), specs.teacher),
            # the learner holds the run's state: not restarted by Ray, it heals (healing.py)
            learner=make_learner(specs.learner, placement, slots),
            evaluator=_actor(EvaluatorActor, opts("evaluator"), specs.evaluator),
            train_set=inputs.train_set,
            heldout_set=inputs.heldout_set,
            sampler=PromptSampler(len(inputs.train_set), cfg.data.prompts_per_step, cfg.seed),
            sampling=SamplingParams(
                e.temperature, e.top_p, e.max_new_tokens, len(tok) <= e.exact_kl_max_vocab
            ),
            policy=make_policy(cfg.staleness),
            transport=for_pipeline(cfg),
            specs=specs,
            learner_slots=slots,
        )
        st.await_started(cfg.reliability.startup_timeout_s)
        return st

    def actors(self) -> dict[str, Any]:
        """Every actor by its name (core/actor_name.py): in events, metrics, spans, restarts."""
        named = {actor_name("generator", i): w for i, w in enumerate(self.pool.workers)}
        named.update(
            rescorer=self.rescorer,
            teacher=self.teacher,
            learner=self.learner,
            evaluator=self.evaluator,
        )
        return named

    def await_started(self, timeout_s: float) -> None:
        """Wait until every actor runs. An actor that fails to start stops the run at once
        with its own error (first line); one not running after `timeout_s` with where it
        is: still starting on a node, or not placed (what it asks, what the cluster has)."""
        from opdflow.cluster.startup import first_line, node_in, where_started

        named = self.actors()
        refs = {actor.pid.remote(): name for name, actor in named.items()}
        deadline = time.monotonic() + timeout_s
        while refs and (left := deadline - time.monotonic()) > 0:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=left)
            for ref in ready:
                name = refs.pop(ref)
                try:
                    ray.get(ref)
                except RayError as exc:
                    self.shutdown()
                    node = node_in(exc)
                    raise StageFailed(
                        stage_of(name),
                        f"{name} did not start{f' on node {node}' if node else ''}: "
                        + first_line(exc),
                    ) from None
        if not refs:
            return
        missing = list(refs.values())
        where = {n: where_started(named[n]) for n in missing}
        self.shutdown()
        r = self.cfg.resources
        unplaced = {n: getattr(r, stage_of(n)) for n in missing if where[n] is None}
        starting = [f"{n} (on node {where[n]})" for n in missing if where[n] is not None]
        parts = []
        if unplaced:
            parts.append(
                f"{', '.join(unplaced)} not running after {timeout_s:.0f} s; they request "
                + "; ".join(
                    f"{n}: {a.num_cpus} CPU, {a.num_gpus} GPU, {a.resources or 'no custom'}"
                    + (f" for each of {a.workers} workers" if getattr(a, "workers", 1) > 1 else "")
                    for n, a in unplaced.items()
                )
                + f"; the cluster has {ray.cluster_resources()}"
            )
        if starting:
            parts.append(
                f"placed but still starting after {timeout_s:.0f} s: {', '.join(starting)}"
            )
        raise StageFailed(
            "startup",
            "; ".join(parts),
            "lower resources.* / engine.replicas or add nodes" if unplaced
            else "raise reliability.startup_timeout_s",
        )  # fmt: skip

    def restore(self, resume: Checkpoint | None, run: RunDir) -> int:
        """Publish the learner's starting version (from a checkpoint if given); returns its step."""
        step = 0
        if resume is not None:
            ray.get(self.learner.load_checkpoint.remote(str(resume.path), resume.step))
            self.policy.load_state(resume.state["policy"])
            run.truncate(resume.step)
            step = resume.step
        self.store.publish(ray.get(self.learner.publish.remote()))
        return step

    def release_weights(self, oldest_needed: int) -> None:
        """Forget versions older than `oldest_needed`; with the collective transport the
        learner then keeps only the live ones and those a pending evaluation will load."""
        self.store.release_below(oldest_needed)
        needed = sorted(set(self.store.live_versions()) | set(self.evals))
        held = self.transport.release(self.learner, needed, self.store.latest)
        if held is not None:
            self.learner_held = {**held, "needed": needed}

    def weight_bytes_live(self) -> int:
        """Bytes the live versions pin: their object-store copies, or (collective) the
        buffers the learner holds for consumers that may still load them (as of the last
        release: live versions, a version a pending evaluation has yet to load, one being
        sent)."""
        return self.transport.bytes_live(self.store, self.learner_held)

    def transport_event(self) -> dict[str, Any]:
        """Which transport (and collective backend) each consumer's fetches use."""
        from opdflow.weights.pair import backend_of

        r, t = self.cfg.resources, self.transport
        how = t.describe(backend_of("cuda" if r.learner.num_gpus > 0 else "cpu"))
        via = {"generator": how if self.cfg.engine.kind != "vllm" or not t.needs_receiver
               else f"{how} (vLLM worker extension)"}  # fmt: skip
        return {"transport": t.name, "requested": self.cfg.weights.transport,
                **via, "rescorer": how, "evaluator": how}  # fmt: skip

    def requests(self, step: int, attempt: int, version: int) -> list[GenerationRequest]:
        """The step's prompts split across replicas (same prompts on every attempt)."""
        rows = self.sampler.rows_for(step)
        parts = min(len(self.pool), len(rows))
        return [
            GenerationRequest(
                [self.train_set.token_ids[j] for j in rows[i::parts]],
                rows[i::parts],
                [self.train_set.answers[j] for j in rows[i::parts]],
                self.cfg.data.responses_per_prompt,
                seed=(self.cfg.seed * 1_000_003 + step * 1009 + attempt * 7919 + i) & 0x7FFFFFFF,
                version=version,
                params=self.sampling,
            )
            for i in range(parts)
        ]

    def evaluate(self, version: int) -> None:
        """Launch held-out evaluation of a published version (collected later)."""
        c = self.cfg.eval
        self.evals[version] = self.evaluator.heldout.remote(
            self.store.get(version),
            self.heldout_set.token_ids,
            self.heldout_set.answers,
            c.samples_per_prompt,
            self.cfg.engine.max_new_tokens,
            c.seed,
        )

    def collect_evals(self, run: RunDir, wait: bool) -> dict[int, dict[str, Any]]:
        """Record finished evaluations in heldout.parquet; returns their numbers by version."""
        done: dict[int, dict[str, Any]] = {}
        refs = list(self.evals.values())
        if not refs:
            return done
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=None if wait else 0)
        for version in sorted(v for v, ref in self.evals.items() if ref in ready):
            try:
                res = ray.get(self.evals.pop(version))
            except RayError as exc:
                raise StageFailed(
                    "evaluator", str(exc).splitlines()[-1], "raise reliability.max_restarts"
                ) from exc
            run.add_heldout(
                [
                    {
                        "version": version,
                        "prompt_index": i,
                        "kl_sum": ks,
                        "tokens": t,
                        "kl": ks / max(t, 1),
                        "accuracy": a,
                    }
                    for i, (ks, t, a) in enumerate(
                        zip(res["kl_sum_P"], res["tokens_P"], res["accuracy_P"])
                    )
                ]
            )
            if "texts" in res:
                run.write_heldout_responses(version, [
                    {"version": version, "prompt_index": i, "response": text,
                     "answer": answer, "correct": right}
                    for i, text, answer, right in res["texts"]
                ])  # fmt: skip
            done[version] = {
                "heldout_version": version,
                "heldout_kl": res["kl"],
                "heldout_accuracy": res["accuracy"],
            }
        return done

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def begin(self, run: RunDir, first: int) -> None:
        """Record which transport each consumer's fetches use; a run from step 0 launches
        the held-out evaluation of version 0."""
        run.event("weights", **self.transport_event())
        if first == 0:
            self.evaluate(0)

    def shutdown(self) -> None:
        """Kill every actor (the placement groups and Ray belong to the wiring and session)."""
        for actor in self.actors().values():
            ray.kill(actor)
