"""Loading a version into a consumer's model: the one copy a consumer makes.

`load_module` copies a version's tensors into a module's parameters and buffers in place.
A module whose tensors can live in one flat buffer laid out like the version
(`FlatLayout`, set up at its first whole-version load) takes each later version as one
copy of the whole buffer (or, arriving on a collective pair, receives it straight into
that buffer, bucket by bucket: bucket.IncomingVersion); anything else loads tensor by
tensor.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from opdflow.weights.version import PackedWeights, TensorSpec, as_torch, tensor_view


def load_module(module: Any, named: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
    """Copy named tensors into `module`'s parameters and buffers in place: the one copy a
    consumer makes (host to device on a GPU). Strict: every state-dict name, shapes equal.

    A whole version (`views`) goes into a module whose tensors live in one flat buffer laid
    out like the version's (`FlatLayout`, set up at the first such load) as one copy of the
    whole buffer: one memcpy, or one host-to-device transfer, instead of one per tensor
    (per-tensor copies run ~1.7x slower here: large single copies stream past the cache).
    A version still arriving on a pair (`receive_into`, bucket.IncomingVersion) is received
    straight into that buffer, with no copy at all. Otherwise tensor by tensor: same dtype
    on CPU through numpy (glibc memcpy, ~1.7x faster than torch's copy_ here), anything
    else (another dtype, a device) through torch. Tied tensors (one storage under two
    names) are copied once."""
    import torch

    receive_into = getattr(named, "receive_into", None)
    if receive_into is not None:
        flat = FlatLayout.of(module, named.specs)
        if flat is not None:
            receive_into(flat.buffer)
            return
    packed = getattr(named, "packed", None)
    if packed is not None:
        flat = FlatLayout.of(module, packed.specs)
        if flat is not None:
            with torch.no_grad():
                copy_bytes(flat.buffer, as_torch(packed.buffer))
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
            copy_bytes(dst, src)
    missing = sorted(set(targets) - seen)
    if missing:
        raise KeyError(f"weights lack {len(missing)} of the model's tensors: {missing[:5]}")


def copy_bytes(dst: Any, src: Any) -> None:
    """dst <- src: glibc memcpy for same-dtype contiguous CPU tensors, else torch."""
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
    def of(cls, module: Any, specs: tuple[TensorSpec, ...]) -> FlatLayout | None:
        """`module`'s flat buffer laid out by `specs` (set up now if it can be); None when
        the module cannot be laid out like them."""
        flat = module.__dict__.get("_opdflow_flat")
        if flat is None or flat.specs != specs or not flat.intact(module):
            flat = cls.adopt(module, specs)
            if flat is None:
                return None
            module.__dict__["_opdflow_flat"] = flat
        return flat

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
