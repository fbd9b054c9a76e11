"""Weight versions in the object store: one flat buffer per version, refs kept by version.

Torch tensors pickled through Ray are copied on every get; one flat numpy buffer is
put once and read zero-copy by every engine (shared/ENVIRONMENT.md measured 200 MB:
put 2.7 GB/s, get 0.35 ms). bfloat16 travels as its raw 16-bit pattern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from opdflow.config import StalenessConfig


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class PackedWeights:
    """A state dict as one uint8 buffer plus a manifest; what the learner ray.put()s."""

    version: int
    specs: tuple[TensorSpec, ...]
    buffer: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


def allocate(entries: list[tuple[str, Any, tuple[int, ...]]], version: int) -> PackedWeights:
    """An uninitialised buffer laid out for (name, torch dtype, shape) entries, in order."""
    import torch

    specs, offset = [], 0
    for name, dtype, shape in entries:
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        specs.append(
            TensorSpec(name, str(dtype).removeprefix("torch."), tuple(shape), offset, nbytes)
        )
        offset += nbytes
    return PackedWeights(version, tuple(specs), np.empty(offset, dtype=np.uint8))


def tensor_view(packed: PackedWeights, spec: TensorSpec) -> Any:
    """A torch tensor viewing `spec`'s bytes of the buffer (writable before it is put)."""
    import torch

    chunk = packed.buffer[spec.offset : spec.offset + spec.nbytes]
    if spec.dtype == "bfloat16":
        return torch.from_numpy(chunk.view(np.int16)).view(torch.bfloat16).reshape(spec.shape)
    return torch.from_numpy(chunk.view(np.dtype(spec.dtype))).reshape(spec.shape)


def pack(state: dict[str, Any], version: int) -> PackedWeights:
    """Copy a torch state dict into one contiguous buffer (dtype kept, bf16 as raw bits):
    one copy per tensor, from wherever it lives (a GPU tensor lands in host memory)."""
    packed = allocate([(n, t.dtype, tuple(t.shape)) for n, t in state.items()], version)
    for spec, tensor in zip(packed.specs, state.values()):
        tensor_view(packed, spec).copy_(tensor.detach())
    return packed


def unpack(packed: PackedWeights) -> dict[str, Any]:
    """Tensors viewing the buffer (copy them into a model with load_state_dict)."""
    import torch

    out = {}
    for spec in packed.specs:
        chunk = packed.buffer[spec.offset : spec.offset + spec.nbytes]
        if spec.dtype == "bfloat16":
            t = torch.from_numpy(chunk.view(np.int16).copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(chunk.view(np.dtype(spec.dtype)).copy())
        out[spec.name] = t.reshape(spec.shape)
    return out


def object_nbytes(ref: Any) -> int:
    """Bytes of a sealed object in Ray's object store (asks its owner; no data moves)."""
    from ray.experimental import get_object_locations

    return int(get_object_locations([ref])[ref]["object_size"])


def live_bound(staleness: StalenessConfig) -> int:
    """Most weight versions the controller may hold: k + 2 (k_max + 2 when adaptive).

    A pending step s was launched with a version >= s - k and the oldest pending step is the
    next one to train, so versions latest - k .. latest are live: k + 1; one more of slack.
    """
    return (staleness.k_max if staleness.policy == "adaptive" else staleness.k) + 2


class WeightStore:
    """Versioned ObjectRefs held by the driver; dropping a ref lets Ray free the version.

    It also keeps each version's size in the object store, so a run reports the bytes its
    live versions pin (`bytes_live`) and their peak, and `check_bound` turns a version
    that is never released (which would fill the object store) into an error.
    """

    def __init__(self) -> None:
        self._refs: dict[int, Any] = {}
        self._nbytes: dict[int, int] = {}
        self.released = 0
        self.peak_live = 0
        self.peak_bytes = 0

    def publish(self, version: int, ref: Any, nbytes: int | None = None) -> None:
        """Hold `ref` as `version`; `nbytes` defaults to the object's size in the store."""
        self._refs[version] = ref
        self._nbytes[version] = object_nbytes(ref) if nbytes is None else int(nbytes)
        self.peak_live = max(self.peak_live, len(self._refs))
        self.peak_bytes = max(self.peak_bytes, self.bytes_live())

    @property
    def latest(self) -> int:
        return max(self._refs) if self._refs else -1

    def get(self, version: int) -> Any:
        if version not in self._refs:
            raise KeyError(f"weights version {version} is not held (live: {sorted(self._refs)})")
        return self._refs[version]

    def release_below(self, version: int) -> None:
        """Forget every version older than `version` (the oldest one still needed)."""
        for v in [v for v in self._refs if v < version]:
            del self._refs[v]
            del self._nbytes[v]
            self.released += 1

    def live_versions(self) -> list[int]:
        return sorted(self._refs)

    def bytes_live(self) -> int:
        """Object-store bytes of the versions held (each version's packed size)."""
        return sum(self._nbytes.values())

    def check_bound(self, max_versions: int) -> None:
        """Raise if more than `max_versions` versions are held (see `live_bound`)."""
        if len(self._refs) > max_versions:
            raise RuntimeError(
                f"{len(self._refs)} weight versions are held ({self.live_versions()}, "
                f"{self.bytes_live() / 2**20:.1f} MiB in the object store) but at most "
                f"{max_versions} may be live at this staleness bound: a version is not being "
                "released (WeightStore.release_below), and the object store would fill"
            )
