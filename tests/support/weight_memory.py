"""A stand-in for the weight path's device layer that records every buffer it hands out.

`RecordingMemory` is weights.memory.WeightMemory with real CPU buffers underneath; with
cuda=True it plays a GPU (the issue allows a fake device layer for placement): it has
"streams" (no-op ones, whose events are reached at once) and an NCCL backend, so the weight
path takes its CUDA branches, and each buffer is recorded as pinned host staging or device
memory. With staged=True a gloo send copies its buckets into two buffers as an NCCL send
does, so that logic runs over real sends. Bytes alive are counted through weak references:
what a path holds, measured.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from opdflow.weights.memory import WeightMemory


@dataclass(frozen=True)
class Allocation:
    kind: str
    """"host" (staging) or "wire" (a bucket buffer)."""
    place: str
    """"pinned", "pageable" or "device"."""
    nbytes: int


class _Reached:
    """An event already reached (the fake stream runs nothing asynchronously)."""

    def synchronize(self) -> None:
        pass


class RecordingMemory(WeightMemory):
    def __init__(self, cuda: bool = False, staged: bool | None = None):
        """`staged`: copy gloo buckets into two wire buffers as NCCL's are (the GPU path's
        buffer logic over real gloo sends); None: as the real layer decides."""
        super().__init__("cpu")
        self.cuda = cuda
        self.staged = staged
        self.allocations: list[Allocation] = []
        self.alive = {"host": 0, "wire": 0}
        """Bytes alive now, by kind."""
        self.peak = dict(self.alive)
        self.events = 0
        self._lock = threading.Lock()

    @property
    def backend(self) -> str:
        return "nccl" if self.cuda else "gloo"

    @property
    def streams(self) -> bool:
        return self.cuda

    def _record(self, buffer, kind: str, place: str, nbytes: int):
        with self._lock:
            self.allocations.append(Allocation(kind, place, nbytes))
            self.alive[kind] += nbytes
            self.peak[kind] = max(self.peak[kind], self.alive[kind])
        weakref.finalize(buffer, self._freed, kind, nbytes)
        return buffer

    def _freed(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self.alive[kind] -= nbytes

    def host(self, nbytes: int) -> np.ndarray:
        place = "pinned" if self.cuda else "pageable"
        return self._record(np.empty(nbytes, dtype=np.uint8), "host", place, nbytes)

    def wire(self, nbytes: int, backend: str):
        place = "device" if backend == "nccl" else "pageable"
        return self._record(torch.empty(nbytes, dtype=torch.uint8), "wire", place, nbytes)

    def staged_buckets(self, backend: str) -> bool:
        return super().staged_buckets(backend) if self.staged is None else self.staged

    def side_stream(self):
        return object() if self.cuda else None

    def on(self, stream):
        return contextlib.nullcontext()

    def mark(self, stream=None):
        if not self.cuda:
            return None
        self.events += 1
        return _Reached()

    def wait(self, event, stream=None) -> None:
        pass

    def of(self, kind: str) -> list[Allocation]:
        return [a for a in self.allocations if a.kind == kind]

    def places(self) -> set[tuple[str, str]]:
        """(kind, place) of every allocation so far."""
        return {(a.kind, a.place) for a in self.allocations}
