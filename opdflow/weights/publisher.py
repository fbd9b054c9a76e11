"""The learner's side of a version's transport: host staging, the put or the held versions.

Rank 0 of the learner casts each version (cast.py) into a host staging buffer this
`Publisher` hands it and reuses (fresh buffers cost a page fault per 4 KiB; pinned on
CUDA: memory.py), whatever the transport; never a whole version on its GPU. Then:

- object_store: `seal`, in a thread of the learner actor, waits for the cast and
  `ray.put`s the staging buffer while the next step trains. The driver's ref is that
  call's result, so a consumer resolves it only once the put is sealed: never an
  incomplete version. Two buffers alternate: one being put while the next is cast.
- collective: the staging buffer is held while the driver says the version may still be
  needed (`retain`); the object store holds only its handle. Each fetch gets it by `send`
  on the consumer's pairs (pair.py), which waits for the cast, in buckets (bucket.py).

Sends are ordered with the learner's own collectives by streams and events, not by one
thread: the training thread issues every collective of the learner's group (the step's,
and the cast's gathers, on the cast's side stream); the "sends" threads issue only pair
sends, one fetch at a time (`_send_lock`), on the sender's own side stream, which waits on
nothing training does. No wait cycle can form: a pair's only other rank is a consumer
that asked for the send and then only receives, waiting on nothing the learner's group
does, so a pair send finishes without any learner collective making progress, and no
learner collective waits for a pair. Why not
one thread for all communication: FSDP issues its collectives from inside the step's
forward and backward, so sends would wait for the step's end (a whole step per fetch);
one sender at a time also keeps the device's bucket buffers at two. docs/WEIGHTS.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from opdflow.weights.bucket import BucketSender
from opdflow.weights.memory import WeightMemory
from opdflow.weights.pair import as_timedelta, node_ip, pair_group
from opdflow.weights.version import PackedWeights, WeightsHandle, allocate, as_torch, layout


class Publisher:
    """The learner's side (rank 0): staging buffers, puts or held versions, and pairs.

    Thread-safe: the learner actor casts in its main thread (or its cast thread) and seals,
    retains in the threads of its "weights" concurrency group and sends in its "sends" one."""

    def __init__(self, transport: Any, device: Any, memory: WeightMemory | None = None):
        """`transport`: a transport.Transport (ObjectStore or Collective); `memory`: where
        buffers live (default: by `device`)."""
        self.transport = transport
        self.device = device
        self.memory = memory or WeightMemory(device)
        self.backend = self.memory.backend
        self.timeout_s = float(getattr(transport, "timeout_s", 300.0))
        self._cond = threading.Condition()
        self._free: list[Any] = []  # staging buffers nobody uses
        self._busy: dict[int, PackedWeights] = {}  # object_store: being put; collective: held
        self._cast: dict[int, Future] = {}  # version -> its cast (done: the bytes are complete)
        self._sending: dict[int, int] = {}  # version -> sends in flight
        self._retain: set[int] = set()  # versions the driver still needs (empty: all)
        self._retain_seq = -1
        self._store: Any = None
        self.address: str | None = None
        self._pairs: dict[str, Any] = {}  # key -> process group
        self._owner: dict[str, str] = {}  # owner (consumer end) -> its current key
        self._send_lock = threading.Lock()  # one fetch's sends at a time on this device
        self.sender: BucketSender | None = None
        bucket = getattr(transport, "bucket_bytes", 0)
        if bucket:
            self.sender = BucketSender(self.memory, self.backend, bucket)
        self.last_put_s = float("nan")
        """Seconds of the latest object-store put (beside the next step)."""

    # ---------------------------------------------------------------- staging

    def buffer(
        self, version: int, entries: list[tuple[str, Any, tuple[int, ...]]]
    ) -> PackedWeights:
        """A staging buffer for `version` laid out for `entries`: a reused one when one is
        free (object store: waits until one of its two is no longer being put)."""
        _, nbytes = layout(entries)
        limit = self.transport.staging_buffers
        with self._cond:
            if limit:
                self._cond.wait_for(lambda: len(self._busy) < limit)
            else:
                self._drop_unretained()
            buf = next((b for b in self._free if b.nbytes == nbytes), None)
            if buf is not None:
                self._free.remove(buf)
            self._free = [b for b in self._free if b.nbytes == nbytes]  # others never return
        if buf is None:
            buf = self.memory.host(nbytes)
        return allocate(entries, version, buf)

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

    def held(self) -> list[int]:
        """Versions whose buffers are held (collective) or being put (object store)."""
        with self._cond:
            return sorted(self._busy)

    def sending(self) -> list[int]:
        """Versions with a send in flight (kept until it ends, even if no longer retained)."""
        with self._cond:
            return sorted(self._sending)

    def held_bytes(self) -> int:
        """Bytes of the staging buffers held (host memory)."""
        with self._cond:
            return sum(p.nbytes for p in self._busy.values())

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
        return WeightsHandle(packed.version, self.transport, packed.specs, packed.nbytes, ref=ref)

    # ---------------------------------------------------------------- collective

    def hold(self, packed: PackedWeights, source: Any, cast: Future | None = None) -> WeightsHandle:
        """Keep a version for the consumers to receive (sends wait for `cast`); its handle
        (manifest, learner)."""
        self._ensure_store()
        self.stage(packed, cast)
        return WeightsHandle(
            packed.version, self.transport, packed.specs, packed.nbytes,
            source=source, address=self.address, backend=self.backend,
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

    def _ensure_store(self) -> None:
        with self._cond:
            if self._store is not None:
                return
            import torch.distributed as dist

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
            dist.PrefixStore(f"opdflow/{key}/", self._store), 0, self.backend,
            self.memory.device, host, self.timeout_s,
        )  # fmt: skip
        with self._cond:
            old = self._owner.get(owner)
            self._pairs.pop(old, None)
            self._pairs[key] = pg
            self._owner[owner] = key

    def send(self, version: int, keys: list[str]) -> int:
        """Send a held version, once cast, to the consumer ends `keys` (one fetch: a stage,
        or every worker of a vLLM engine): a header, then its buckets, each bucket to every
        end before the next; its size. A version no longer held is refused in the header,
        so the consumer does not hang. One fetch is sent at a time (see the docstring)."""
        import torch

        with self._cond:
            groups = [self._pairs[key] for key in keys]
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
            assert self.sender is not None, "the object-store transport sends nothing"
            header = torch.tensor([int(ok), version, nbytes, self.sender.bucket_bytes])
            with self._send_lock:
                self.sender.send(groups, header, as_torch(packed.buffer) if ok else None)
            if failed is not None:
                raise failed
            if not ok:
                raise KeyError(
                    f"weights version {version} is no longer held by the learner "
                    f"(held: {self.held()})"
                )
        finally:
            if packed is not None:
                with self._cond:
                    self._sending[version] -= 1
                    if not self._sending[version]:
                        del self._sending[version]
                    self._drop_unretained()
        return nbytes
