"""The device a stage computes on, and how much memory its work peaked at.

One place decides where tensors live: a Ray actor computes on the GPU Ray assigned it (Ray
sets CUDA_VISIBLE_DEVICES, so it is always cuda:0 inside the actor) and on the CPU when it
has none; a plain process (a script, a test, the GPU check) takes CUDA when it sees one.
Stages create their tensors there and move results to host memory once, at their
boundary (`to_host`).

Peak memory (`PeakMemory`) means the same on both: the bytes of tensors alive at the
window's highest point. On CUDA that is the caching allocator's peak of allocated bytes.
On a CPU, where the allocator is the OS, it is the tensors the stage holds when the window
opens (its parameters, gradients and optimizer state, counted from the tensors) plus how
far the process's resident set rose above its size then (VmHWM, reset at the start): so
the interpreter, torch's libraries and whatever else the process held before are left
out, as the GPU allocator never sees them. The rise follows tensor memory where glibc
returns freed buffers to the OS (MALLOC_MMAP_THRESHOLD_ fixed, e.g. 1 MiB: its default
threshold grows and keeps freed buffers on the heap); code touched for the first time in
the window counts too, so a first step reads a little high.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

DEVICE_ENV = "OPDFLOW_DEVICE"
"""Override of every stage's device: "cpu", "cuda" or "cuda:N" (default: decided here)."""


def _ray_gpu_ids() -> list | None:
    """GPU ids Ray assigned this worker process; None outside a Ray worker (driver, script)."""
    ray = sys.modules.get("ray")  # never import Ray just to ask: plain processes have none
    if ray is None or not ray.is_initialized():
        return None
    try:
        ctx = ray.get_runtime_context()
        if ctx.worker.mode != ray.WORKER_MODE:
            return None
        return list(ray.get_gpu_ids())
    except (AttributeError, RuntimeError):
        return None


def stage_device(requested: str | None = None) -> torch.device:
    """Where a stage computes: `requested` if given, else $OPDFLOW_DEVICE, else CUDA when this
    process has a GPU (the one Ray assigned an actor), else the CPU."""
    import torch

    choice = requested or os.environ.get(DEVICE_ENV, "").strip() or "auto"
    if choice != "auto":
        device = torch.device(choice)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {choice!r} asked for, but this process sees no CUDA GPU")
        return device
    gpus = _ray_gpu_ids()
    has_cuda = torch.cuda.is_available()
    if has_cuda and (gpus is None or gpus):
        return torch.device("cuda", 0 if gpus else torch.cuda.current_device())
    return torch.device("cpu")


def to_host(t: torch.Tensor, dtype: Any = None) -> np.ndarray:
    """A tensor as a numpy array in host memory (one device-to-host copy; none on a CPU)."""
    t = t.detach()
    if dtype is not None:
        t = t.to(dtype)
    return t.cpu().numpy()


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window on `device` (GPU allocator peak, or process VmHWM)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: writing 5 resets the process's peak resident set to its current size
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # elsewhere the peak is the process's lifetime peak: an upper bound


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory since `reset_peak_memory`, in GB (1e9 bytes): allocated bytes on a GPU,
    resident set size on a CPU."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    try:  # the high-water mark, and never below the resident set now: some kernels and
        # sandboxes do not move VmHWM after clear_refs
        with open("/proc/self/status") as f:
            kb = dict(line.split()[:2] for line in f if line.startswith(("VmHWM:", "VmRSS:")))
        return max(int(kb["VmHWM:"]), int(kb["VmRSS:"])) * 1024 / 1e9
    except (OSError, KeyError, ValueError):
        import resource

        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, else KiB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e9


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the storages behind `tensors` (each counted once; sharded DTensors: the
    local shard's storage; None skipped)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _resident_bytes() -> int | None:
    """This process's resident set now (VmRSS), None where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return kb * 1024
    except (OSError, StopIteration):
        return None


class PeakMemory:
    """A window over which a stage's peak memory is read (module docstring: what it means
    on a GPU and on a CPU)."""

    def __init__(self, device: torch.device, held_bytes: int = 0):
        """Open the window; `held_bytes`: bytes of the tensors the stage holds right now
        (tensor_bytes of its parameters, gradients and optimizer state), counted on a CPU."""
        self.device = device
        self.held_bytes = held_bytes
        self.resident_bytes = None if device.type == "cuda" else _resident_bytes()
        reset_peak_memory(device)

    def gb(self) -> float:
        """The window's peak so far, in GB (1e9 bytes)."""
        if self.device.type == "cuda" or self.resident_bytes is None:
            return peak_memory_gb(self.device)  # without /proc: the lifetime peak RSS
        rise = max(peak_memory_gb(self.device) * 1e9 - self.resident_bytes, 0.0)
        return (rise + self.held_bytes) / 1e9
