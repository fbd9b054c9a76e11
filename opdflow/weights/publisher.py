"""The learner's side of a version's transport: its buffers, the put or the held versions.

Rank 0 of the learner casts each version (cast.py) into a buffer this `Publisher` hands it
and reuses (fresh buffers cost a page fault per 4 KiB), then:

- object_store: `seal`, in a thread of the learner actor, waits for the cast and
  `ray.put`s the buffer while the next step trains. The driver's ref is that call's
  result, so a consumer resolves it only once the put is sealed: never an incomplete
  version. Two buffers alternate: one being put while the next is cast.
- collective: the buffer (on the learner's device) is held while the driver says the
  version may still be needed (`retain`); the object store holds only its handle. Each
  consumer end receives it by `send` on its pair (pairs.py), which waits for the cast.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import numpy as np

from opdflow.weights.pair import (
    as_timedelta,
    backend_of,
    pair_group,
    piece_end,
    plan_pieces,
    sync_device,
)
from opdflow.weights.version import PackedWeights, WeightsHandle, WeightsRef, allocate, layout

OBJECT_STORE_BUFFERS = 2
"""Host buffers the object-store publisher alternates between (one being put, one cast)."""


class Publisher:
    """The learner's side (rank 0): buffers, puts or held versions, and pairs.

    Thread-safe: the learner actor casts in its main thread (or its cast thread) and seals,
    retains and sends in the threads of its "weights" concurrency group."""

    def __init__(self, transport: str, device: Any, timeout_s: float = 300.0):
        if transport not in ("object_store", "collective"):
            raise ValueError(f"transport {transport!r}: expected object_store or collective")
        self.transport = transport
        self.device = device
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._free: list[Any] = []  # buffers nobody uses
        self._busy: dict[int, PackedWeights] = {}  # object_store: being put; collective: held
        self._cast: dict[int, Future] = {}  # version -> its cast (done: the bytes are complete)
        self._sending: dict[int, int] = {}  # version -> sends in flight
        self._retain: set[int] = set()  # versions the driver still needs (empty: all)
        self._retain_seq = -1
        self._store: Any = None
        self.address: str | None = None
        self._pairs: dict[str, Any] = {}  # key -> process group
        self._owner: dict[str, str] = {}  # owner (consumer end) -> its current key
        self.last_put_s = float("nan")
        """Seconds of the latest object-store put (beside the next step)."""

    # ---------------------------------------------------------------- buffers

    def buffer(
        self, version: int, entries: list[tuple[str, Any, tuple[int, ...]]]
    ) -> PackedWeights:
        """A buffer for `version` laid out for `entries`: a reused one when one is free
        (object store: waits until one of its two is no longer being put)."""
        _, nbytes = layout(entries)
        with self._cond:
            if self.transport == "object_store":
                self._cond.wait_for(lambda: len(self._busy) < OBJECT_STORE_BUFFERS)
            else:
                self._drop_unretained()
            buf = next((b for b in self._free if b.nbytes == nbytes), None)
            if buf is not None:
                self._free.remove(buf)
            self._free = [b for b in self._free if b.nbytes == nbytes]  # others never return
        if buf is None:
            buf = self._new_buffer(nbytes)
        return allocate(entries, version, buf)

    def _new_buffer(self, nbytes: int) -> Any:
        if backend_of(self.device) == "nccl":
            import torch

            free, _ = torch.cuda.mem_get_info(self.device)
            if nbytes > free:
                raise RuntimeError(
                    f"weights.transport = 'collective' keeps each live version on the learner's "
                    f"GPU: {nbytes / 1e9:.1f} GB more do not fit ({free / 1e9:.1f} GB free); "
                    "lower staleness.k or set weights.transport = 'object_store'"
                )
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return np.empty(nbytes, dtype=np.uint8)

    def _release(self, version: int) -> None:
        """(Lock held.) `version`'s buffer goes back to the free list."""
        packed = self._busy.pop(version, None)
        self._cast.pop(version, None)
        if packed is not None:
            self._free.append(packed.buffer)
        self._cond.notify_all()

    def stage(self, packed: PackedWeights, cast: Future | None = None) -> None:
        """Mark a buffer as published; its put, or the sends of it, begin once `cast` is
        done (None: it is cast already)."""
        with self._cond:
            self._busy[packed.version] = packed
            if cast is not None:
                self._cast[packed.version] = cast

    def _complete(self, version: int) -> None:
        """Wait until `version`'s bytes are complete (its cast raises here if it failed)."""
        with self._cond:
            cast = self._cast.get(version)
        if cast is not None:
            cast.result()

    # ---------------------------------------------------------------- object store

    def seal(self, version: int) -> WeightsHandle:
        """ray.put the staged version once cast (a copy into the object store, off the
        critical path); its buffer is free again once the put is sealed."""
        import ray

        with self._cond:
            packed = self._busy[version]
        try:
            self._complete(version)
            t0 = time.perf_counter()
            ref = ray.put(packed)
            self.last_put_s = time.perf_counter() - t0
        finally:
            with self._cond:
                self._release(version)
        return WeightsHandle.in_object_store(packed, ref)

    # ---------------------------------------------------------------- collective

    def hold(self, packed: PackedWeights, source: Any, cast: Future | None = None) -> WeightsHandle:
        """Keep a version for the consumers to receive (sends wait for `cast`); its handle
        (manifest, learner)."""
        self._ensure_store()
        self.stage(packed, cast)
        return WeightsHandle(
            packed.version, "collective", packed.specs, packed.nbytes,
            source=source, address=self.address, backend=backend_of(self.device),
            timeout_s=self.timeout_s,
        )  # fmt: skip

    def retain(self, versions: Iterable[int], seq: int = 0) -> list[int]:
        """Keep only `versions` (the driver's live ones and those a pending evaluation will
        load) and any published since (newer than all of them). `seq` orders the calls (they
        may run in parallel threads): an older call than one already applied is ignored.
        Returns the versions held afterwards (a version being cast or sent stays until that
        ends)."""
        with self._cond:
            if seq >= self._retain_seq:
                self._retain, self._retain_seq = set(versions), seq
                self._drop_unretained()
            return sorted(self._busy)

    def _drop_unretained(self) -> None:
        if not self._retain:
            return
        newest = max(self._retain)
        for v in [v for v in self._busy if v < newest and v not in self._retain]:
            cast = self._cast.get(v)
            if not self._sending.get(v) and (cast is None or cast.done()):
                self._release(v)

    def held(self) -> list[int]:
        """Versions whose buffers are held (collective) or being put (object store)."""
        with self._cond:
            return sorted(self._busy)

    def sending(self) -> list[int]:
        """Versions with a send in flight (kept until it ends, even if no longer retained)."""
        with self._cond:
            return sorted(self._sending)

    def held_bytes(self) -> int:
        with self._cond:
            return sum(p.nbytes for p in self._busy.values())

    def _ensure_store(self) -> None:
        with self._cond:
            if self._store is not None:
                return
            import torch.distributed as dist

            from opdflow.weights.pair import node_ip

            host = node_ip()
            self._store = dist.TCPStore(
                host, 0, is_master=True, wait_for_workers=False,
                timeout=as_timedelta(self.timeout_s),
            )  # fmt: skip
            self.address = f"{host}:{self._store.port}"

    def open_pair(self, key: str, owner: str) -> None:
        """Rank 0 of a new pair with a consumer end (blocks until it joins); a previous pair
        of the same owner (a consumer that restarted) is dropped."""
        import torch.distributed as dist

        self._ensure_store()
        host = str(self.address).rsplit(":", 1)[0]
        pg = pair_group(
            dist.PrefixStore(f"opdflow/{key}/", self._store), 0, backend_of(self.device),
            self.device, host, self.timeout_s,
        )  # fmt: skip
        with self._cond:
            old = self._owner.get(owner)
            self._pairs.pop(old, None)
            self._pairs[key] = pg
            self._owner[owner] = key

    def send(self, version: int, key: str, piece_bytes: int = 0) -> int:
        """Send a held version to the consumer end `key` once cast: a header, then its
        bytes, in the pieces `plan_pieces(specs, piece_bytes)` makes (the receiver's plan);
        its size. A version no longer held is refused in the header, so the consumer does
        not hang."""
        import torch

        with self._cond:
            pg = self._pairs[key]
            packed = self._busy.get(version)
            if packed is not None:
                self._sending[version] = self._sending.get(version, 0) + 1
        ok = packed is not None
        try:
            failed = None
            if ok:
                try:
                    self._complete(version)
                except Exception as exc:  # refused in the header, then raised
                    ok, failed = False, exc
            nbytes = packed.nbytes if ok else 0
            header = torch.tensor([int(ok), version, nbytes], dtype=torch.int64)
            if backend_of(self.device) == "nccl":
                header = header.to(self.device)
            pg.send([header], 1, 0).wait()
            if failed is not None:
                raise failed
            if not ok:
                raise KeyError(
                    f"weights version {version} is no longer held by the learner "
                    f"(held: {self.held()})"
                )
            whole = _as_tensor(packed.buffer)
            for lo, hi in plan_pieces(packed.specs, piece_bytes):
                start, end = packed.specs[lo].offset, piece_end(packed.specs, hi, packed.nbytes)
                pg.send([whole[start:end]], 1, 1).wait()
            sync_device(self.device)
        finally:
            if packed is not None:
                with self._cond:
                    self._sending[version] -= 1
                    if not self._sending[version]:
                        del self._sending[version]
                    self._drop_unretained()
        return nbytes


def _as_tensor(buffer: Any) -> Any:
    import torch

    return torch.from_numpy(buffer) if isinstance(buffer, np.ndarray) else buffer


def put_version(packed: PackedWeights) -> WeightsRef:
    """Publish a packed version through the object store from a driver or a test, as the
    learner does: the WeightsRef consumers take."""
    import ray

    handle = WeightsHandle.in_object_store(packed, ray.put(packed))
    return WeightsRef(packed.version, ray.put(handle), packed.nbytes)
