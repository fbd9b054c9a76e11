"""A weights version: one flat buffer laid out by a manifest, its handle and the driver's ref.

A version's bytes are one flat buffer laid out by a manifest (name, dtype, shape, offset of
each tensor), written once by the learner's FP32 -> BF16 cast (cast.py) into host staging
(memory.py) and read in place by every consumer: `tensor_view` and `views` are zero-copy
torch views of the buffer (loader.py copies them into a model). Torch tensors pickled
through Ray are copied on every get; a flat numpy buffer is read zero-copy (a 200 MB get
took 0.35 ms here). bfloat16 travels as its raw 16-bit pattern. What the driver holds and
hands to stages per version is a `WeightsRef`: its ObjectRef resolves to a `WeightsHandle`
(manifest, the transport that moves it, and where the bytes are: an inner object-store
ref, or the learner to receive them from in buckets) once the version is complete.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

ALIGN = 64
"""Each tensor starts on a 64-byte boundary (any dtype's view is aligned; vector copies too)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class PackedWeights:
    """A state dict as one uint8 buffer plus a manifest: a version in host staging (a numpy
    array, what the object store takes), or a received part of one (a torch uint8 tensor,
    on a consumer's device)."""

    version: int
    specs: tuple[TensorSpec, ...]
    buffer: Any

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


@dataclass(frozen=True)
class WeightsHandle:
    """What a published version's ObjectRef resolves to: its manifest, the transport that
    moves it (transport.py: it also fetches it) and where its bytes are.

    object_store: `ref` is the object holding the PackedWeights (sealed before this handle
    exists). collective: the bytes stay in the learner's host staging; `source` is its actor
    handle, `address` the rendezvous ("host:port" of its TCPStore) a consumer pairs with,
    `backend` the pair's."""

    version: int
    transport: Any
    """A transport.Transport (ObjectStore or Collective)."""
    specs: tuple[TensorSpec, ...]
    nbytes: int
    ref: Any = None
    source: Any = None
    address: str | None = None
    backend: str | None = None
    """collective: "nccl" (buckets move between GPUs) or "gloo" (in host memory)."""


@dataclass(frozen=True)
class WeightsRef:
    """A published weights version as the driver holds it and hands it to a stage: its
    number, the ObjectRef that resolves to its `WeightsHandle` once the version is complete,
    and the bytes it pins (its buffer's size).

    Ray resolves an ObjectRef given as a call's argument before the call runs; inside this
    value it travels unresolved, so a stage already at `version` fetches nothing and one that
    is not resolves it itself (`handle`)."""

    version: int
    ref: Any
    nbytes: int | None = None
    """None: ask the object store for the size of `ref` (store.object_nbytes)."""
    timeline: int = 0
    """Which learner group published it: 0 for the run's first, one more after each time the
    learner healed (rebuilt from a checkpoint, driver/healing.py). Version numbers restart
    at the checkpoint's step on a new timeline, so a consumer holding version v of an older
    timeline does not hold this version v."""

    def handle(self) -> WeightsHandle:
        """The version's handle (blocks until the version is complete)."""
        import ray

        return ray.get(self.ref)


def layout(
    entries: Iterable[tuple[str, Any, tuple[int, ...]]],
) -> tuple[tuple[TensorSpec, ...], int]:
    """Specs of (name, torch dtype, shape) entries laid out in order, and the buffer's size."""
    import torch

    specs, offset = [], 0
    for name, dtype, shape in entries:
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        specs.append(
            TensorSpec(name, str(dtype).removeprefix("torch."), tuple(shape), offset, nbytes)
        )
        offset += -(-nbytes // ALIGN) * ALIGN
    return tuple(specs), offset


def allocate(
    entries: list[tuple[str, Any, tuple[int, ...]]], version: int, buffer: Any = None
) -> PackedWeights:
    """A buffer laid out for (name, torch dtype, shape) entries, in order: `buffer` when
    given (reused: its pages are already mapped), else a new uninitialised host buffer."""
    specs, nbytes = layout(entries)
    if buffer is None:
        buffer = np.empty(nbytes, dtype=np.uint8)
    elif buffer.nbytes != nbytes:
        raise ValueError(f"a reused weights buffer holds {buffer.nbytes} bytes, not {nbytes}")
    return PackedWeights(version, specs, buffer)


def as_torch(chunk: Any) -> Any:
    """A torch uint8 tensor over `chunk` (a numpy slice, possibly read-only, or a tensor)."""
    import torch

    if isinstance(chunk, torch.Tensor):
        return chunk
    with warnings.catch_warnings():  # object-store buffers are read-only: views, never written
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.from_numpy(chunk)


def tensor_view(packed: PackedWeights, spec: TensorSpec) -> Any:
    """A torch tensor viewing `spec`'s bytes of the buffer (no copy; writable before a put)."""
    return typed(as_torch(packed.buffer[spec.offset : spec.offset + spec.nbytes]), spec)


def typed(raw: Any, spec: TensorSpec) -> Any:
    """`spec`'s tensor over its raw bytes (a uint8 tensor of spec.nbytes), without a copy."""
    import torch

    return raw.view(getattr(torch, spec.dtype)).reshape(spec.shape)


class VersionViews(dict):
    """A version's tensors as zero-copy views by name (a dict), with the packed version they
    view, so `loader.load_module` can copy the whole buffer at once into a module laid out
    like it."""

    packed: PackedWeights


def views(packed: PackedWeights) -> VersionViews:
    """Every tensor of a version as a zero-copy view of its buffer, by name."""
    out = VersionViews((spec.name, tensor_view(packed, spec)) for spec in packed.specs)
    out.packed = packed
    return out


def pack(state: dict[str, Any], version: int) -> PackedWeights:
    """Copy a torch state dict into one contiguous host buffer (dtype kept, bf16 as raw bits):
    one copy per tensor (tests and tools; the learner casts straight into its staging)."""
    packed = allocate([(n, t.dtype, tuple(t.shape)) for n, t in state.items()], version)
    for spec, tensor in zip(packed.specs, state.values()):
        tensor_view(packed, spec).copy_(tensor.detach())
    return packed
