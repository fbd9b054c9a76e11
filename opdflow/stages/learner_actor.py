"""The learner as Ray actors: a thin wrapper of stages/learner.py's Learner, one per rank.

With resources.learner.workers = N the learner is N actors (one GPU each where it has
GPUs; they may span nodes) in one torch.distributed group. Rank 0 is the learner the
controller sees: it starts ranks 1..N-1 (owned by it, so they die with it), picks the
rendezvous (its node's IP and a free port), and forwards every call that needs all ranks
(train_step, publish, save/load_checkpoint, sees) to them before running its own part.
After each step every rank takes part in gathering the BF16 weights and rank 0 puts them
in the object store as the next version.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from opdflow.config import TrainConfig
from opdflow.rollout import RolloutBatch
from opdflow.stages import StageActor, pin_threads


class LearnerActor(StageActor):
    """One rank of the learner (a Ray actor); rank 0 leads the others."""

    def __init__(
        self,
        model_path: str,
        threads: int,
        train: TrainConfig,
        seed: int,
        workers: int = 1,
        peer_options: list[dict[str, Any]] | None = None,
        rank: int = 0,
        rendezvous: str | None = None,
    ):
        import ray

        from opdflow.fsdp import DistSpec, free_port
        from opdflow.stages.learner import Learner

        pin_threads(threads)
        self.rank = rank
        self.peers: list[Any] = []
        dist = None
        if workers > 1:
            if rank == 0:
                rendezvous = f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"
                options = peer_options or [{} for _ in range(workers - 1)]
                self.peers = [
                    ray.remote(LearnerActor)
                    .options(**options[r - 1])
                    .remote(model_path, threads, train, seed, workers, None, r, rendezvous)
                    for r in range(1, workers)
                ]
            dist = DistSpec(rank, workers, str(rendezvous))
        self.learner = Learner(model_path, train, seed, dist=dist)

    def _on_peers(self, method: str, *args: Any) -> list:
        return [getattr(peer, method).remote(*args) for peer in self.peers]

    def _with_peers(self, method: str, *args: Any) -> Any:
        """Run `method` on every rank (the peers first, they block in collectives until this
        rank joins); this rank's result, once all are done."""
        import ray

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
        the version's ref boxed under "weights" (rank 0)."""
        import ray

        refs = self._on_peers("train_step", step, ray.put(batch)) if self.peers else []
        t_epoch, t0 = time.time(), time.perf_counter()
        out = self.learner.train_step(step, batch)
        self.add_span("learner", step, batch.version, t_epoch, time.perf_counter() - t0,
                      batch.num_tokens)  # fmt: skip
        weights = self._publish()
        ray.get(refs)
        return {**out, "publish_s": weights[1], "weights": weights[:1]}

    def publish(self) -> list:
        """Put the current weights in the object store as BF16; [ref, seconds], the ref boxed
        so the driver holds it unresolved (None on ranks other than 0)."""
        return self._with_peers("publish")

    def _publish(self) -> list:
        import ray

        t0 = time.perf_counter()
        version = self.learner.version
        with self.span("publish", version - 1, version) as s:
            packed = self.learner.bf16_weights()
            if packed is None:
                return [None, time.perf_counter() - t0]
            ref = ray.put(packed)
            s["bytes"] = packed.nbytes
        return [ref, time.perf_counter() - t0]

    def save_checkpoint(self, out_dir: str) -> None:
        self._with_peers("save_checkpoint", out_dir)

    def _save_checkpoint(self, out_dir: str) -> None:
        self.learner.save_checkpoint(out_dir)

    def load_checkpoint(self, ckpt_dir: str, step: int) -> None:
        self._with_peers("load_checkpoint", ckpt_dir, step)

    def _load_checkpoint(self, ckpt_dir: str, step: int) -> None:
        self.learner.load_checkpoint(ckpt_dir, step)

    def sees(self, probe: str, token: str) -> list[dict[str, Any]]:
        """Whether each rank reads `probe` holding `token` (the driver wrote it into the
        checkpoint directory): [{"rank", "node", "ok"}], one per rank."""
        import ray

        peers = ray.get(self._on_peers("sees", probe, token))
        return [self._sees(probe, token), *(r for part in peers for r in part)]

    def _sees(self, probe: str, token: str) -> dict[str, Any]:
        import ray

        try:
            ok = Path(probe).read_text() == token
        except OSError:
            ok = False
        return {"rank": self.rank, "node": ray.util.get_node_ip_address(), "ok": ok}

    def record(self) -> list[tuple[int, int]]:
        return self.learner.record()
