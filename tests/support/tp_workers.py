"""Stub tensor-parallel workers: processes spawned like vLLM's "mp" executor spawns its
workers, each running the real WorkerExtension (engines/vllm_worker.py) over a stand-in for
vLLM's reload path that keeps this rank's shard of each tensor, as vLLM's column-parallel
weight loaders do (rows split evenly by rank; a tensor whose first dimension does not split
is kept whole, like a replicated one)."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
from typing import Any

import torch

from opdflow.engines.vllm_worker import WorkerExtension


class StubWorker(WorkerExtension):
    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.shards: dict[str, Any] = {}

    def reload_weights(self, weights_iterator: Any, is_checkpoint_format: bool) -> None:
        for name, tensor in weights_iterator:
            self.shards[name] = shard_of(tensor, self.rank, self.world).clone()


def shard_of(tensor: Any, rank: int, world: int) -> Any:
    """Rank `rank`'s rows of `tensor` (all of it when its rows do not split evenly)."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if tensor.dim() == 0 or rows % world:
        return tensor
    part = rows // world
    return tensor.narrow(0, rank * part, part)


def digest(shards: dict[str, Any]) -> dict[str, str]:
    return {
        n: hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
        for n, t in shards.items()
    }


def _serve(rank: int, world: int, conn: Any) -> None:
    worker = StubWorker(rank, world)
    while True:
        call = conn.recv()
        if call is None:
            return
        method, args = call
        getattr(worker, method)(*args)
        conn.send(digest(worker.shards))


class StubEngine:
    """`world` stub workers in spawned processes; `rpc` calls a WorkerExtension method on
    each (vLLM's collective_rpc) and returns each worker's shard digests."""

    def __init__(self, world: int):
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(world):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(rank, world, there), daemon=True)
            proc.start()
            self.conns.append(here)
            self.procs.append(proc)

    def rpc(self, method: str, *args: Any) -> list[dict[str, str]]:
        for conn in self.conns:
            conn.send((method, args))
        return [conn.recv() for conn in self.conns]

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=30)
