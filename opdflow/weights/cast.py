"""The learner's FP32 -> BF16 cast of its weights into a publish buffer, beside the next step.

Publishing a version costs one pass over the weights: each FP32 tensor is cast by `copy_`
straight into its place in the buffer that goes to the consumers (weights.py's layout). On
one CPU thread that pass cannot reach the bound of 2x a memcpy of the BF16 bytes: it reads
twice the bytes a memcpy reads (3 GB for a 1.5 GB version took 0.26 s to read alone here,
2.1x the memcpy). But the parameters change only at the optimizer step, so the cast need
not block the step that follows it: `BF16Cast.start` runs it in its own thread while the
next step's forward and backward read the same parameters, and `BF16Cast.settle`, called
right before anything writes them (the optimizer step, a checkpoint load), waits for it.
The step then loses only that wait and what the cast's memory traffic slows it by (the
benchmark measures both as the increase of a step's time). The cast's future tells the
transport when the version's bytes are complete: nothing is put or sent before.

Sharded tensors (DTensor) are all-gathered one at a time, collectives every rank must run
in the same order as the step's own: a sharded learner casts in its calling thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from opdflow.weights.version import PackedWeights, tensor_view


def bf16_entries(state: Mapping[str, Any]) -> list[tuple[str, Any, tuple[int, ...]]]:
    """(name, dtype, shape) of each tensor as published: floating ones in BF16, in order."""
    import torch

    return [(n, torch.bfloat16 if v.is_floating_point() else v.dtype, tuple(v.shape))
            for n, v in state.items()]  # fmt: skip


def write_bf16(state: Mapping[str, Any], packed: PackedWeights | None) -> None:
    """Cast a (FP32) state to BF16 straight into `packed`, laid out by `bf16_entries`: one
    pass per tensor (copy_ casts as it writes), no other copy. None: take part without a
    buffer (a data-parallel rank other than 0).

    A tensor is cast where it lives and written wherever the buffer lives (same device: one
    pass; a GPU tensor into a host buffer: the cast, then one copy). Sharded tensors
    (DTensor) are all-gathered one at a time, in BF16, so no rank holds more than one full
    tensor beyond its shards; every rank of their group must call this."""
    import torch
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for i, value in enumerate(state.values()):
            value = value.detach()
            if isinstance(value, DTensor):
                if value.is_floating_point():
                    value = value.to(torch.bfloat16)
                value = value.full_tensor()
            if packed is not None:
                tensor_view(packed, packed.specs[i]).copy_(value)


class BF16Cast:
    """Casts a module's weights into publish buffers, one version at a time, in its own
    thread when `background` (else in the caller's). Not thread-safe: one owner calls it."""

    def __init__(self, background: bool):
        import torch

        self.background = background
        self._pool: ThreadPoolExecutor | None = None
        if background:  # the thread computes with as many torch threads as its owner
            self._pool = ThreadPoolExecutor(
                1, "bf16-cast", initializer=torch.set_num_threads,
                initargs=(torch.get_num_threads(),),
            )  # fmt: skip
        self._running: Future | None = None
        self.last_cast_s = math.nan
        """Seconds the latest cast took (where it ran)."""
        self.waited_s = 0.0
        """Seconds `settle` waited for running casts (the owner reads and resets it)."""

    def start(self, state: Mapping[str, Any], packed: PackedWeights | None) -> Future:
        """Cast `state` into `packed` (`write_bf16`) once any previous cast has ended; the
        future is done when the bytes are complete (already, unless in the background).
        The caller must `settle` before it next writes the tensors of `state`."""
        self.settle()
        tensors = {name: value.detach() for name, value in state.items()}
        if self._pool is None:
            done: Future = Future()
            self._run(tensors, packed)
            done.set_result(packed)
            return done
        self._running = self._pool.submit(self._run, tensors, packed)
        return self._running

    def _run(self, tensors: dict[str, Any], packed: PackedWeights | None) -> PackedWeights | None:
        t0 = time.perf_counter()
        write_bf16(tensors, packed)
        self.last_cast_s = time.perf_counter() - t0
        return packed

    def settle(self) -> float:
        """Wait for the running cast (it reads the weights); the seconds waited. A cast that
        failed raises here (and for its transport, which then publishes nothing)."""
        running, self._running = self._running, None
        if running is None:
            return 0.0
        t0 = time.perf_counter()
        running.result()
        waited = time.perf_counter() - t0
        self.waited_s += waited
        return waited

    def close(self) -> None:
        """Settle and stop the thread."""
        self.settle()
        if self._pool is not None:
            self._pool.shutdown()
