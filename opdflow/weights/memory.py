"""Where the weight path's buffers live, and the stream its device copies run on.

One place decides, by the learner's (or consumer's) device and the pair's backend:

- Host staging: every version's bytes, whatever the transport, in host memory; on CUDA
  pinned (registered with the driver), so the cast's device-to-host copy and the buckets'
  host-to-device copies run asynchronously on a side stream. Never a whole version on the
  learner's GPU.
- Buckets: what a collective send moves a version through, two at a time. For NCCL two
  buffers on the learner's GPU that each bucket is copied into from staging; for gloo
  the staging is already where the wire reads (host memory): its bucket-sized slices
  are sent as they are, no copy (`staged_buckets`).
- The side stream and its events on CUDA (`streams`); on a CPU there is none: copies
  are synchronous, events are already reached, and the cast's twin of the side stream
  is a thread (cast.py).

A test may stand a subclass in for this layer (a "cuda" that allocates in host memory and
records each allocation), so the placement decisions are checked where no GPU is.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import numpy as np


class WeightMemory:
    """The few device operations the weight path uses, for one process's device."""

    def __init__(self, device: Any = "cpu"):
        import torch

        self.device = torch.device(device)

    @property
    def backend(self) -> str:
        """The collective backend of pairs on this device: nccl on a GPU, gloo on a CPU."""
        return "nccl" if self.device.type == "cuda" else "gloo"

    @property
    def streams(self) -> bool:
        """Whether copies run asynchronously on a side stream (CUDA) or at once (CPU)."""
        return self.device.type == "cuda"

    def host(self, nbytes: int) -> np.ndarray:
        """A host staging buffer of `nbytes` (numpy: the object store reads it zero-copy);
        pinned on CUDA. numpy's allocation is exact (torch's pinned allocator rounds up
        to a power of two: 16 GB for a 15 GB version) and sits on huge pages."""
        buffer = np.empty(nbytes, dtype=np.uint8)
        if self.streams and nbytes:
            _pin(buffer)
        return buffer

    def staged_buckets(self, backend: str) -> bool:
        """Whether a send copies each bucket from host staging into a buffer on the wire
        device first (NCCL: the GPU), rather than sending slices of the staging (gloo)."""
        return backend == "nccl"

    def wire(self, nbytes: int, backend: str) -> Any:
        """A bucket buffer of `nbytes` on the wire device: this GPU for NCCL, host memory
        for gloo."""
        import torch

        device = self.device if backend == "nccl" else "cpu"
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def side_stream(self) -> Any:
        """A new side stream (CUDA), else None."""
        import torch

        return torch.cuda.Stream(self.device) if self.streams else None

    def on(self, stream: Any) -> contextlib.AbstractContextManager:
        """Make `stream` current while inside (nothing on a CPU)."""
        import torch

        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def mark(self, stream: Any = None) -> Any:
        """An event recorded on `stream` (default: the current one) where it now stands;
        None on a CPU (every copy is already done)."""
        import torch

        if not self.streams:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, event: Any, stream: Any = None) -> None:
        """`stream` (default: the current one) waits for `event` on the device; the host
        does not block."""
        import torch

        if event is not None:
            (stream or torch.cuda.current_stream(self.device)).wait_event(event)

    def synchronize(self, event: Any) -> None:
        """Block the host until `event` is reached."""
        if event is not None:
            event.synchronize()


def _pin(buffer: np.ndarray) -> None:
    """Page-lock a numpy buffer for asynchronous copies (cudaHostRegister), for as long
    as the buffer lives."""
    import torch

    cudart = torch.cuda.cudart()
    ptr, nbytes = buffer.ctypes.data, buffer.nbytes
    err = cudart.cudaHostRegister(ptr, nbytes, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of a {nbytes / 1e9:.1f} GB staging buffer failed "
                           f"({err}): the host is short of lockable memory (ulimit -l)")  # fmt: skip
    weakref.finalize(buffer, cudart.cudaHostUnregister, ptr)
