"""The learner's FP32 -> BF16 cast of its weights into host staging, beside the next step.

Publishing a version costs one pass over the weights: each FP32 tensor is cast by `copy_`
straight into its place in the host staging buffer that goes to the consumers (version.py's
layout; memory.py's staging). The parameters change only at the optimizer step, so the
cast need not block the step that follows it: `BF16Cast.start` begins it, the next step's
forward and backward read the same parameters meanwhile, and `BF16Cast.settle`, called
right before anything writes them (the optimizer step, a checkpoint load), orders the
writes after the cast's reads. Where the cast runs:

- "stream" (a GPU): issued by the calling (training) thread on a side stream, which
  first waits for the training stream's event after the optimizer step; each tensor is
  cast on the GPU (gathered first when sharded: in the training thread, so every rank
  issues the gathers in the same order as the step's own collectives) and copied to
  pinned staging asynchronously. The host does not wait: `settle` makes the training
  stream wait for the cast's last event, and a waiter thread completes the future when
  the stream reaches it. No whole version is ever on the GPU: one tensor at a time.
- "thread" (a one-worker CPU learner): the CPU twin of the side stream, a thread of its
  own; `settle` waits for it. On one CPU thread a cast in the step cannot reach the bound
  of 2x a memcpy of the BF16 bytes (it reads twice the bytes; 2.1x here), beside it costs
  the step only what its memory traffic slows it by.
- "caller" (a sharded CPU learner): in the calling thread (gathers are collectives every
  rank runs in the step's order; gloo has no streams to put them beside the step).

The cast's future tells the transport when the version's bytes are complete: nothing is
put or sent before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from opdflow.weights.memory import WeightMemory
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
    pass; a GPU tensor into pinned host staging: the cast, then an asynchronous copy on the
    current stream). Sharded tensors (DTensor) are all-gathered one at a time, in BF16, so
    no rank holds more than one full tensor beyond its shards; every rank of their group
    must call this."""
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
                tensor_view(packed, packed.specs[i]).copy_(value, non_blocking=True)


class BF16Cast:
    """Casts a module's weights into staging buffers, one version at a time: on a side
    stream where `memory` has streams, else in its own thread when `background`, else in
    the caller's. Not thread-safe: one owner calls it."""

    def __init__(self, background: bool, memory: WeightMemory | None = None):
        import torch

        self.memory = memory or WeightMemory("cpu")
        self.mode = "stream" if self.memory.streams else "thread" if background else "caller"
        self._pool: ThreadPoolExecutor | None = None
        if self.mode == "thread":  # the thread computes with as many torch threads as its owner
            self._pool = ThreadPoolExecutor(
                1, "bf16-cast", initializer=torch.set_num_threads,
                initargs=(torch.get_num_threads(),),
            )  # fmt: skip
        elif self.mode == "stream":  # completes each cast's future once its stream is there
            self._pool = ThreadPoolExecutor(1, "bf16-cast-waiter")
        self._stream: Any = None
        self._running: Future | None = None
        self._done_event: Any = None
        self.last_cast_s = math.nan
        """Seconds the latest cast took (where it ran; on a stream, until it was reached)."""
        self.waited_s = 0.0
        """Seconds `settle` waited for running casts (the owner reads and resets it)."""

    def start(self, state: Mapping[str, Any], packed: PackedWeights | None) -> Future:
        """Cast `state` into `packed` (`write_bf16`) once any previous cast has ended; the
        future is done when the bytes are complete (already, in the caller mode). The
        caller must `settle` before it next writes the tensors of `state`."""
        self.settle()
        tensors = {name: value.detach() for name, value in state.items()}
        if self.mode == "stream":
            return self._on_stream(tensors, packed)
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

    def _on_stream(self, tensors: dict[str, Any], packed: PackedWeights | None) -> Future:
        """Issue the cast on the side stream, after the training stream's work so far (the
        optimizer's writes); a future done once the stream has copied the last byte."""
        mem = self.memory
        if self._stream is None:
            self._stream = mem.side_stream()
        after_step = mem.mark()
        t0 = time.perf_counter()
        with mem.on(self._stream):
            mem.wait(after_step, self._stream)
            write_bf16(tensors, packed)
            self._done_event = done = mem.mark(self._stream)

        def reached() -> PackedWeights | None:
            mem.synchronize(done)
            self.last_cast_s = time.perf_counter() - t0
            return packed

        assert self._pool is not None
        self._running = self._pool.submit(reached)
        return self._running

    def settle(self) -> float:
        """Order the owner's next writes of the weights after the running cast's reads; the
        seconds the host waited (none on a stream: the training stream waits for the cast's
        event on the device). A cast that failed raises here (and for its transport, which
        then publishes nothing)."""
        running, self._running = self._running, None
        if running is None:
            return 0.0
        if self.mode == "stream":
            self.memory.wait(self._done_event)
            self._done_event = None
            if running.done():
                running.result()
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
