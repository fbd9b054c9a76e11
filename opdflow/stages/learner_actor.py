"""The learner as Ray actors: a thin wrapper of stages/learner.py's Learner, one per rank.

With resources.learner.workers = N the learner is N actors (one GPU each where it has
GPUs; they may span nodes) in one torch.distributed group. Rank 0 is the learner the
controller sees: it starts ranks 1..N-1 (owned by it, so they die with it), picks the
rendezvous (its node's IP and a free port), and forwards every call that needs all ranks
(train_step, publish, save/load_checkpoint, sees) to them before running its own part.
After each step every rank takes part in casting (gathering) the BF16 weights and rank 0
publishes them as the next version: cast into host staging it reuses (weights/cast.py:
beside the next step), then handed to the run's transport (weights/transport.py): a
`ray.put` in a thread of its "weights" concurrency group, or held for the consumers to
receive over their pairs in buckets (weights/publisher.py). The `WeightsRef` train_step
returns resolves only once the version is complete. Create it with `learner_class()`,
which declares those concurrency groups.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import ray

from opdflow.core.rollout import RolloutBatch
from opdflow.stages.actor import StageActor, pin_threads
from opdflow.stages.specs import LearnerSpec
from opdflow.weights.transport import ObjectStore
from opdflow.weights.version import WeightsRef

CONCURRENCY_GROUPS = {"weights": 4, "sends": 4, "watch": 2}
"""Threads beside the training one: "weights" for seals (object-store puts), pair setups and
the driver's retain calls; "sends" for collective sends, which run one fetch at a time
(weights/publisher.py orders them with the learner's collectives), so those queued never
hold up a retain or a pair setup; "watch" for the driver's watch on each rank and its pings
(driver/learner_group.py)."""
RUNTIME_ENV = {"env_vars": {"THP_MEM_ALLOC_ENABLE": "1"}}
"""torch puts the learner's CPU tensors of 2 MiB or more on transparent huge pages (where
the kernel allows them on request). Streaming the FP32 weights, as the BF16 cast and the
optimizer do, ran at ~2/3 the speed on 4 KiB pages here (a TLB miss, and a stop of the
hardware prefetcher, every 4 KiB); numpy already asks for huge pages for the buffers."""


def learner_class(cls: type | None = None) -> Any:
    """LearnerActor (or a subclass `cls`) as a Ray actor class: its "weights" and "sends"
    concurrency groups, and its tensors on huge pages."""
    return ray.remote(concurrency_groups=CONCURRENCY_GROUPS, runtime_env=RUNTIME_ENV)(
        cls or LearnerActor
    )


class LearnerActor(StageActor):
    """One rank of the learner (a Ray actor); rank 0 leads the others."""

    def __init__(
        self,
        spec: LearnerSpec,
        peer_options: list[dict[str, Any]] | None = None,
        rank: int = 0,
        rendezvous: str | None = None,
        timeline: int = 0,
    ):
        """`spec`: the model, training settings, seed, resources (torch threads, workers =
        ranks) and transport (default the object store) of every rank; `peer_options`: the
        Ray options rank 0 starts each other rank with; `timeline`: the learner group's
        number in the run (0, then one more each time the learner heals), carried by every
        version it publishes (WeightsRef.timeline)."""
        from opdflow.compute.fsdp import DistSpec, free_port
        from opdflow.stages.learner import Learner

        res, transport = spec.resources, spec.transport or ObjectStore()
        model_path, train, seed = spec.model, spec.train, spec.seed
        pin_threads(res.torch_threads)
        self.rank, self.timeline = rank, timeline
        self.peers: list[Any] = []
        dist = None
        if res.workers > 1:
            if rank == 0:
                rendezvous = f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"
                options = peer_options or [{} for _ in range(res.workers - 1)]
                self.peers = [
                    learner_class()
                    .options(**options[r - 1])
                    .remote(spec, None, r, rendezvous, timeline)
                    for r in range(1, res.workers)
                ]
            dist = DistSpec(rank, res.workers, str(rendezvous), ray.util.get_node_ip_address())
        if self.peers:  # a rank that fails to start ends rank 0's wait with its own error
            from opdflow.cluster.startup import build_watching

            starts = {f"learner rank {r}": p.pid.remote() for r, p in enumerate(self.peers, 1)}
            self.learner = build_watching(
                lambda: Learner(model_path, train, seed, dist=dist), starts
            )
        else:
            self.learner = Learner(model_path, train, seed, dist=dist)
        self.publisher = None
        if rank == 0:
            from opdflow.weights.publisher import Publisher

            self.publisher = Publisher(transport, self.learner.device)

    def _on_peers(self, method: str, *args: Any) -> list:
        return [getattr(peer, method).remote(*args) for peer in self.peers]

    def _with_peers(self, method: str, *args: Any) -> Any:
        """Run `method` on every rank (the peers first, they block in collectives until this
        rank joins); this rank's result, once all are done."""
        refs = self._on_peers(method, *args)
        out = getattr(self, f"_{method}")(*args)
        ray.get(refs)
        return out

    def add_span(self, *args: Any, **kwargs: Any) -> None:
        if self.rank == 0:  # rank 0's spans stand for the learner (the others are not drained)
            super().add_span(*args, **kwargs)

    # ---------------------------------------------------------------- calls on every rank

    def train_step(self, step: int, batch: RolloutBatch) -> dict[str, Any]:
        """Train `step` on `batch`, then publish the new version: the step's metrics, with
        its WeightsRef under "weights" (rank 0; it resolves once the version is complete)
        and the seconds publishing blocked the actor ("publish_s"; the step also waited
        "cast_wait_s" for the previous version's cast)."""
        refs = self._on_peers("train_step", step, ray.put(batch)) if self.peers else []
        t_epoch, t0 = time.time(), time.perf_counter()
        out = self.learner.train_step(step, batch)
        self.add_span("learner", step, batch.version, t_epoch, time.perf_counter() - t0,
                      batch.num_tokens)  # fmt: skip
        weights, seconds = self._publish()
        ray.get(refs)
        return {**out, "publish_s": seconds, "weights": weights}

    def publish(self) -> WeightsRef | None:
        """Publish the current weights as BF16: their WeightsRef (None on ranks other than 0)."""
        return self._with_peers("publish")[0]

    def _publish(self) -> tuple[WeightsRef | None, float]:
        """Start the cast into reused host staging and hand it to the transport, which
        puts or sends it once cast: the version's WeightsRef and the seconds this took."""
        t0 = time.perf_counter()
        version = self.learner.version
        with self.span("publish", version - 1, version) as s:
            pub = self.publisher
            packed = pub.buffer(version, self.learner.bf16_entries()) if pub else None
            cast = self.learner.cast_bf16(packed)
            if pub is None or packed is None:
                return None, time.perf_counter() - t0
            me = ray.get_runtime_context().current_actor
            ref = pub.transport.publish(pub, packed, cast, me)
            s["bytes"] = packed.nbytes
        weights = WeightsRef(version, ref, packed.nbytes, self.timeline)
        return weights, time.perf_counter() - t0

    # ---------------------------------------------------------------- weights threads (rank 0)

    @ray.method(concurrency_group="weights")
    def seal(self, version: int) -> Any:
        """Put a cast version in the object store; its WeightsHandle once sealed."""
        assert self.publisher is not None
        return self.publisher.seal(version)

    @ray.method(concurrency_group="weights")
    def open_pair(self, key: str, owner: str) -> None:
        """Join a consumer end's new pair (collective)."""
        assert self.publisher is not None
        self.publisher.open_pair(key, owner)

    @ray.method(concurrency_group="sends")
    def send_weights(self, version: int, keys: list[str]) -> int:
        """Send a held version to one fetch's consumer ends (collective: each bucket to
        every end of `keys` before the next); bytes sent."""
        assert self.publisher is not None
        return self.publisher.send(version, keys)

    @ray.method(concurrency_group="weights")
    def retain(self, versions: list[int], seq: int = 0) -> dict[str, Any]:
        """Keep only these versions (and newer) for the consumers (collective); what is held
        afterwards (see `held`). `seq` orders the calls (see Publisher.retain)."""
        assert self.publisher is not None
        self.publisher.retain(versions, seq)
        return self.held()

    @ray.method(concurrency_group="weights")
    def held(self) -> dict[str, Any]:
        """Versions and bytes held for consumers (collective) or being put (object store),
        and the versions with a send in flight."""
        pub = self.publisher
        assert pub is not None
        return {"versions": pub.held(), "bytes": pub.held_bytes(), "sending": pub.sending()}

    def save_checkpoint(self, out_dir: str, background: bool = False) -> float:
        """Every rank saves its shards into `out_dir`; background: each returns once its
        state is staged in host memory, the files written in a thread. The seconds this
        blocked the learner (every rank's part)."""
        t0 = time.perf_counter()
        self._with_peers("save_checkpoint", out_dir, background)
        return time.perf_counter() - t0

    def _save_checkpoint(self, out_dir: str, background: bool) -> None:
        self.learner.save_checkpoint(out_dir, background)

    def checkpoint_written(self, wait: bool = False) -> bool:
        """Whether the last save is complete on disk (rank 0 coordinates the save: it
        finishes after every rank's part); wait: until it is."""
        return self.learner.checkpoint_written(wait)

    def load_checkpoint(self, ckpt_dir: str, step: int) -> None:
        self._with_peers("load_checkpoint", ckpt_dir, step)

    def _load_checkpoint(self, ckpt_dir: str, step: int) -> None:
        self.learner.load_checkpoint(ckpt_dir, step)

    def sees(self, probe: str, token: str) -> list[dict[str, Any]]:
        """Whether each rank reads `probe` holding `token` (the driver wrote it into the
        checkpoint directory): [{"rank", "node", "ok"}], one per rank."""
        peers = ray.get(self._on_peers("sees", probe, token))
        return [self._sees(probe, token), *(r for part in peers for r in part)]

    def _sees(self, probe: str, token: str) -> dict[str, Any]:
        try:
            ok = Path(probe).read_text() == token
        except OSError:
            ok = False
        return {"rank": self.rank, "node": ray.util.get_node_ip_address(), "ok": ok}

    def record(self) -> list[tuple[int, int]]:
        return self.learner.record()

    # ---------------------------------------------------------------- the driver's watch

    def ranks(self) -> list[Any]:
        """Every rank's actor handle, in rank order (rank 0: this one)."""
        return [ray.get_runtime_context().current_actor, *self.peers]

    def where(self) -> dict[str, Any]:
        """This rank's process and node."""
        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "pid": self.pid(), "node_id": ctx.get_node_id(),
                "node": ray.util.get_node_ip_address()}  # fmt: skip

    @ray.method(concurrency_group="watch")
    def watch(self) -> None:
        """Never returns: the driver waits on it beside its other calls, and its failure
        is the prompt news that this rank's process (or node) died."""
        threading.Event().wait()

    @ray.method(concurrency_group="watch")
    def alive(self) -> int:
        """Answers at once, even while the training thread is blocked in a collective."""
        return self.rank
