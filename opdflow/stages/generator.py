"""The generator stage: rollout-engine replicas and the pool that routes work to them.

A step's prompt groups are split across replicas (least busy first); each replica
fetches the weights version it is told to use from the object store only when it changes.
"""

from __future__ import annotations

from typing import Any

import ray

from opdflow.engines.base import GenerationRequest
from opdflow.rollout import RolloutBatch
from opdflow.stages import StageActor, pin_threads
from opdflow.supervisor import Link


class GeneratorWorker(StageActor):
    """One rollout engine replica (a Ray actor)."""

    def __init__(
        self, model_path: str, pad_id: int, eos_id: int, kind: str, recipe: str, threads: int
    ):
        pin_threads(threads)
        if kind == "vllm":
            from opdflow.engines.vllm_engine import VLLMEngine as engine_cls
        else:
            from opdflow.engines.torch_engine import TorchEngine as engine_cls
        self.engine = engine_cls(model_path, pad_id=pad_id, eos_id=eos_id, recipe=recipe)

    def generate(
        self, request: GenerationRequest, weights_box: list, step: int = -1
    ) -> RolloutBatch:
        if request.version != self.engine.version:
            from opdflow.weights import unpack

            with self.span("fetch", step, request.version) as s:
                packed = ray.get(weights_box[0])
                self.engine.load_weights(unpack(packed), request.version)
                s["bytes"] = packed.nbytes
        with self.span("generator", step, request.version) as s:
            batch = self.engine.generate(request)
            s["tokens"] = batch.num_tokens
        return batch


class GeneratorPool:
    """Driver-side handle on N generator replicas; routes chunks to the least busy one."""

    def __init__(self, workers: list[Any]):
        self.workers = list(workers)
        self._inflight: dict[Any, int] = {}  # ObjectRef -> worker index

    def _load(self) -> list[int]:
        done, _ = (
            ray.wait(list(self._inflight), num_returns=len(self._inflight), timeout=0)
            if self._inflight
            else ([], [])
        )
        for ref in done:
            self._inflight.pop(ref, None)
        counts = [0] * len(self.workers)
        for idx in self._inflight.values():
            counts[idx] += 1
        return counts

    def submit(
        self, requests: list[GenerationRequest], weights_ref: Any, step: int = -1
    ) -> list[Link]:
        """Launch each request on the least busy replica; returns one Link per request."""
        counts = self._load()
        links = []
        for req in requests:
            idx = min(range(len(self.workers)), key=lambda i: counts[i])
            ref = self.workers[idx].generate.remote(req, [weights_ref], step)
            self._inflight[ref] = idx
            counts[idx] += 1
            links.append(Link(f"generator[{idx}]", self.workers[idx], ref))
        return links

    def __len__(self) -> int:
        return len(self.workers)
