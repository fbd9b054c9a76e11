"""The device a stage computes on, and how much memory its work peaked at.

One place decides where tensors live: a Ray actor computes on the GPU Ray assigned it (Ray
sets CUDA_VISIBLE_DEVICES, so it is always cuda:0 inside the actor) and on the CPU when it
has none; a plain process (a script, a test, the GPU check) takes CUDA when it sees one.
Stages create their tensors there and move results to host memory once, at their
boundary (`to_host`). Peak memory is what a GPU's allocator reports on CUDA and the
process's peak resident set (VmHWM, reset per step) on a CPU, where the allocator is the OS.
"""

from __future__ import annotations

import os
import sys
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
    try:
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        return kb * 1024 / 1e9
    except (OSError, StopIteration):
        import resource

        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, else KiB
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e9
