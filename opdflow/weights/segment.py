"""A version shared with the worker processes of a tensor-parallel vLLM engine on one node.

A tensor-parallel vLLM engine runs its workers as processes vLLM spawned (its "mp"
executor), not as Ray workers: they cannot resolve an ObjectRef, and vLLM's RPC would
pickle a version's tensors and copy every byte to every worker. So the engine's actor,
which reads the version zero-copy from its node's object store, copies it once into a
`SharedSegment` (a file in /dev/shm, reused for every version of its size) and hands
each worker the segment's path and the manifest; each worker maps it read-only, zero-copy
(`attach`), and loads its shard through vLLM's reload path (vLLM's weight loaders take
each rank's slice of the full tensor). One host copy per engine and version instead of
one per worker. Once every worker has mapped it, the file is unlinked: the memory lives
as long as the mappings, and nothing is left behind if the actor is killed.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import uuid
import weakref
from typing import Any

import numpy as np

from opdflow.weights.loader import copy_bytes
from opdflow.weights.version import PackedWeights, TensorSpec, as_torch, layout, tensor_view

SHM_DIR = "/dev/shm"
"""Where segments are made (memory-backed); the temp directory when it lacks room."""


class SharedSegment:
    """One version's bytes in a shared file mapping, written by the engine's actor."""

    def __init__(self, nbytes: int):
        root = SHM_DIR if _room(SHM_DIR, nbytes) else tempfile.gettempdir()
        self.path = os.path.join(root, f"opdflow-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self.nbytes = nbytes
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, max(nbytes, 1))
            self._map = mmap.mmap(fd, max(nbytes, 1), mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.buffer = np.frombuffer(self._map, dtype=np.uint8, count=nbytes)
        self.linked = True
        weakref.finalize(self, _unlink, self.path)

    def unlink(self) -> None:
        """Remove the file (mappings already made stay valid)."""
        if self.linked:
            _unlink(self.path)
            self.linked = False


def share(
    state: Any, segment: SharedSegment | None
) -> tuple[SharedSegment, tuple[TensorSpec, ...]]:
    """Copy a version into `segment` (a new one unless it has the version's size): its
    flat buffer at once when `state` views one (`version.views`), else tensor by tensor
    laid out like a version. The segment and the manifest the workers read it by."""
    packed = getattr(state, "packed", None)
    if packed is not None:
        specs, nbytes = packed.specs, packed.nbytes
    else:
        specs, nbytes = layout((n, t.dtype, tuple(t.shape)) for n, t in state.items())
    if segment is None or segment.nbytes != nbytes:
        segment = SharedSegment(nbytes)
    if packed is not None:
        copy_bytes(as_torch(segment.buffer), as_torch(packed.buffer))
    else:
        out = PackedWeights(-1, specs, segment.buffer)
        for spec, tensor in zip(specs, state.values()):
            copy_bytes(tensor_view(out, spec), tensor.detach().cpu())
    return segment, specs


def attach(path: str, nbytes: int) -> np.ndarray:
    """A worker's read-only, zero-copy map of a segment (kept as long as the array lives)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mapped = mmap.mmap(fd, max(nbytes, 1), mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    return np.frombuffer(mapped, dtype=np.uint8, count=nbytes)


def _room(directory: str, nbytes: int) -> bool:
    try:
        st = os.statvfs(directory)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize > nbytes


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
