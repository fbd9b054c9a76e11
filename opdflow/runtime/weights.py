"""Weight versions: one flat buffer per version, the handle consumers resolve, the driver's refs.

A version's bytes are one flat buffer laid out by a manifest (name, dtype, shape, offset of
each tensor), written once by the learner's FP32 -> BF16 cast (cast.py) and read in place
by every consumer: `tensor_view` and `views` are zero-copy torch views of the buffer, and
`load_module` copies them straight into a model's parameters (the only copy a consumer
makes). Torch tensors pickled through Ray are copied on every get; a flat numpy buffer is
read zero-copy (a 200 MB get took 0.35 ms here). bfloat16 travels as its raw 16-bit
pattern. What the driver holds and hands to stages per version is a `WeightsRef`: its
ObjectRef resolves to a `WeightsHandle` (manifest plus where the bytes are: an inner
object-store ref, or the learner to receive them from by a collective, transport.py);
`WeightStore` keeps them by version, their bytes and the k_max + 2 bound (the staleness
policy's `live_versions`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
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
    """A state dict as one uint8 buffer plus a manifest; what the learner ray.put()s.

    `buffer` is a numpy array in host memory (what the object store takes) or a torch uint8
    tensor (a device buffer of the collective transport)."""

    version: int
    specs: tuple[TensorSpec, ...]
    buffer: Any

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


@dataclass(frozen=True)
class WeightsHandle:
    """What a published version's ObjectRef resolves to: its manifest and where its bytes are.

    object_store: `ref` is the object holding the PackedWeights (sealed before this handle
    exists). collective: the bytes stay with the learner; `source` is its actor handle,
    `address` the rendezvous ("host:port" of its TCPStore) a consumer pairs with, `backend`
    the pair's."""

    version: int
    transport: str
    specs: tuple[TensorSpec, ...]
    nbytes: int
    ref: Any = None
    source: Any = None
    address: str | None = None
    backend: str | None = None
    """collective: "nccl" (the learner's buffer is on its GPU) or "gloo" (host memory)."""
    timeout_s: float = 300.0
    """collective: a pair setup or one version's receive that takes longer fails."""

    @classmethod
    def in_object_store(cls, packed: PackedWeights, ref: Any) -> WeightsHandle:
        """The handle of `packed` once `ref` (its sealed object-store copy) exists."""
        return cls(packed.version, "object_store", packed.specs, packed.nbytes, ref=ref)


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
    """None: ask the object store for the size of `ref` (`object_nbytes`)."""
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


def _as_torch(chunk: Any) -> Any:
    """A torch uint8 tensor over `chunk` (a numpy slice, possibly read-only, or a tensor)."""
    import torch

    if isinstance(chunk, torch.Tensor):
        return chunk
    with warnings.catch_warnings():  # object-store buffers are read-only: views, never written
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return torch.from_numpy(chunk)


def tensor_view(packed: PackedWeights, spec: TensorSpec) -> Any:
    """A torch tensor viewing `spec`'s bytes of the buffer (no copy; writable before a put)."""
    import torch

    raw = _as_torch(packed.buffer[spec.offset : spec.offset + spec.nbytes])
    return raw.view(getattr(torch, spec.dtype)).reshape(spec.shape)


class VersionViews(dict):
    """A version's tensors as zero-copy views by name (a dict), with the packed version they
    view, so `load_module` can copy the whole buffer at once into a module laid out like it."""

    packed: PackedWeights


def views(packed: PackedWeights) -> VersionViews:
    """Every tensor of a version as a zero-copy view of its buffer, by name."""
    out = VersionViews((spec.name, tensor_view(packed, spec)) for spec in packed.specs)
    out.packed = packed
    return out


def pack(state: dict[str, Any], version: int) -> PackedWeights:
    """Copy a torch state dict into one contiguous host buffer (dtype kept, bf16 as raw bits):
    one copy per tensor (tests and tools; the learner casts straight into its buffer)."""
    packed = allocate([(n, t.dtype, tuple(t.shape)) for n, t in state.items()], version)
    for spec, tensor in zip(packed.specs, state.values()):
        tensor_view(packed, spec).copy_(tensor.detach())
    return packed


def load_module(module: Any, named: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
    """Copy named tensors into `module`'s parameters and buffers in place: the one copy a
    consumer makes (host to device on a GPU). Strict: every state-dict name, shapes equal.

    A whole version (`views`) goes into a module whose tensors live in one flat buffer laid
    out like the version's (`FlatLayout`, set up at the first such load) as one copy of the
    whole buffer: one memcpy, or one host-to-device transfer, instead of one per tensor
    (per-tensor copies run ~1.7x slower here: large single copies stream past the cache).
    Otherwise tensor by tensor: same dtype on CPU through numpy (glibc memcpy, ~1.7x faster
    than torch's copy_ here), anything else (another dtype, a device) through torch. Tied
    tensors (one storage under two names) are copied once."""
    import torch

    packed = getattr(named, "packed", None)
    if packed is not None and FlatLayout.load(module, packed):
        return
    targets = module.state_dict(keep_vars=True)
    items = named.items() if isinstance(named, Mapping) else named
    seen: set[str] = set()
    done_ptrs: set[int] = set()
    with torch.no_grad():
        for name, src in items:
            dst = targets.get(name)
            if dst is None:
                raise KeyError(f"weights carry {name!r}, which the model does not have")
            if tuple(dst.shape) != tuple(src.shape):
                raise ValueError(
                    f"{name}: model shape {tuple(dst.shape)}, weights {tuple(src.shape)}"
                )
            seen.add(name)
            dst = dst.detach()
            if dst.data_ptr() in done_ptrs:
                continue
            done_ptrs.add(dst.data_ptr())
            _copy(dst, src)
    missing = sorted(set(targets) - seen)
    if missing:
        raise KeyError(f"weights lack {len(missing)} of the model's tensors: {missing[:5]}")


def _copy(dst: Any, src: Any) -> None:
    if (dst.device.type == src.device.type == "cpu" and dst.dtype == src.dtype
            and dst.is_contiguous() and src.is_contiguous()):  # fmt: skip
        np.copyto(_numpy_bits(dst), _numpy_bits(src))
    else:
        dst.copy_(src)


class FlatLayout:
    """A module's tensors re-homed into one flat buffer laid out like a published version.

    Set up at a module's first whole-version load when every tensor's dtype matches the
    version's (a BF16 engine model; not one that computes in float32): each parameter's
    data (and each buffer) becomes a view of the flat buffer at its spec's offset, so every
    later version loads with one copy of the whole buffer. Tied tensors view the first of
    their names (the other names' bytes are copied but unused). A module whose tensors were
    re-pointed since (a transform assigning new storage) falls back to per-tensor loads."""

    def __init__(self, specs: tuple[TensorSpec, ...], buffer: Any, ptrs: dict[str, int]):
        self.specs = specs
        self.buffer = buffer
        self.ptrs = ptrs

    @classmethod
    def load(cls, module: Any, packed: PackedWeights) -> bool:
        """Load `packed` into `module` with one copy if it is (or can be) laid out like it."""
        import torch

        flat = module.__dict__.get("_opdflow_flat")
        if flat is None or flat.specs != packed.specs or not flat.intact(module):
            flat = cls.adopt(module, packed.specs)
            if flat is None:
                return False
            module.__dict__["_opdflow_flat"] = flat
        with torch.no_grad():
            _copy(flat.buffer, _as_torch(packed.buffer))
        return True

    @classmethod
    def adopt(cls, module: Any, specs: tuple[TensorSpec, ...]) -> FlatLayout | None:
        """Re-home `module`'s tensors into a new flat buffer laid out by `specs` (their
        values are kept); None when the names, dtypes or shapes do not match."""
        import torch

        targets = module.state_dict(keep_vars=True)
        if set(targets) != {s.name for s in specs}:
            return None
        for s in specs:
            t = targets[s.name]
            if str(t.dtype).removeprefix("torch.") != s.dtype or tuple(t.shape) != s.shape:
                return None
        device = next(iter(targets.values())).device
        if any(t.device != device for t in targets.values()):
            return None
        end = max(s.offset + s.nbytes for s in specs)
        buffer = torch.empty(end, dtype=torch.uint8, device=device)
        packed = PackedWeights(-1, specs, buffer)
        homed: dict[int, Any] = {}  # id of a tensor already re-homed (tied) -> its view
        with torch.no_grad():
            for s in specs:
                t = targets[s.name]
                view = tensor_view(packed, s)
                if id(t) in homed:
                    view.copy_(homed[id(t)])
                    continue
                view.copy_(t)
                homed[id(t)] = view
                owner, _, attr = s.name.rpartition(".")
                sub = module.get_submodule(owner) if owner else module
                if isinstance(t, torch.nn.Parameter):
                    t.data = view
                else:
                    sub._buffers[attr] = view
        after = module.state_dict(keep_vars=True)
        return cls(specs, buffer, {n: after[n].data_ptr() for n in after})

    def intact(self, module: Any) -> bool:
        """Whether every tensor still views the flat buffer where it was put."""
        now = module.state_dict(keep_vars=True)
        return now.keys() == self.ptrs.keys() and all(
            now[n].data_ptr() == p for n, p in self.ptrs.items()
        )


def _numpy_bits(t: Any) -> np.ndarray:
    """A CPU tensor's bytes as a numpy array of the same width (bf16 as int16)."""
    import torch

    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        return t.view(width).numpy()


def object_nbytes(ref: Any) -> int:
    """Bytes of a sealed object in Ray's object store (asks its owner; no data moves)."""
    from ray.experimental import get_object_locations

    return int(get_object_locations([ref])[ref]["object_size"])


class WeightStore:
    """Versioned ObjectRefs held by the driver; dropping a ref lets Ray free the version.

    It also keeps each version's bytes (where they live depends on the transport: the
    object store, or the learner holding them for the collective), so a run reports the
    bytes its live versions pin (`bytes_live`) and their peak, and `check_bound` turns a
    version that is never released (which would fill memory) into an error.
    """

    def __init__(self) -> None:
        self._refs: dict[int, WeightsRef] = {}
        self._nbytes: dict[int, int] = {}
        self.released = 0
        self.peak_live = 0
        self.peak_bytes = 0

    def publish(self, weights: WeightsRef) -> None:
        """Hold `weights` as its version (its size asked of the object store if not given)."""
        nbytes = object_nbytes(weights.ref) if weights.nbytes is None else weights.nbytes
        self._refs[weights.version] = weights
        self._nbytes[weights.version] = int(nbytes)
        self.peak_live = max(self.peak_live, len(self._refs))
        self.peak_bytes = max(self.peak_bytes, self.bytes_live())

    @property
    def latest(self) -> int:
        return max(self._refs) if self._refs else -1

    def get(self, version: int) -> WeightsRef:
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
        """Bytes of the versions held (each version's buffer size)."""
        return sum(self._nbytes.values())

    def check_bound(self, max_versions: int) -> None:
        """Raise if more than `max_versions` (a policy's `live_versions`) versions are held."""
        if len(self._refs) > max_versions:
            raise RuntimeError(
                f"{len(self._refs)} weight versions are held ({self.live_versions()}, "
                f"{self.bytes_live() / 2**20:.1f} MiB) but at most "
                f"{max_versions} may be live at this staleness bound: a version is not being "
                "released (WeightStore.release_below), and memory would fill"
            )
