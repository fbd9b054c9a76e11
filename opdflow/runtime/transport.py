"""How a weights version's bytes reach its consumers: the object store, or a collective.

Either way a version is one ObjectRef the driver holds (its place in the version bound)
that resolves to a `weights.WeightsHandle`, and the learner's critical path pays only the
FP32 -> BF16 cast into a buffer it reuses (`Publisher.buffer`: fresh buffers cost a page
fault per 4 KiB):

- object_store: the cast writes a host buffer; a thread of the learner actor `ray.put`s it
  (`Publisher.seal`) while the next step trains. The driver's ref is that call's result,
  so a consumer resolves it only once the put is sealed: never an incomplete version. A
  consumer's get is zero-copy; `weights.load_module` copies the views into its model.
- collective: the cast writes a buffer on the learner's device that the learner keeps while
  the driver says the version may still be needed (`Publisher.retain`); the object store
  holds only the handle. A consumer pairs with the learner once (`PairEnd`: a 2-rank
  torch.distributed group over the learner's TCPStore, NCCL between GPUs, gloo on CPUs;
  nothing goes through host memory on GPUs) and then receives each version it needs by a
  send on that pair: whole into a buffer it reuses, or (a vLLM worker, whose GPU is mostly
  KV cache) in pieces of whole layers (`plan_pieces`). Pairs rather than one static group:
  a consumer that restarts or that the generator pool adds just opens its own pair.

Why not Ray Direct Transport (ray 2.60, alpha): it works here once the receiving actor
also declares `enable_tensor_transport=True` (without it the transfer deadlocks and times
out after 60 s), but an actor may be in only one collective group per backend, its groups
are static (a restarted or added consumer means tearing the group down everywhere), its
torch_gloo group reuses the process's default process group (the data-parallel learner's
FSDP group) and its NCCL groups need cupy.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import numpy as np

from opdflow.runtime.weights import (
    PackedWeights,
    TensorSpec,
    WeightsHandle,
    allocate,
    layout,
    views,
)

TRANSPORTS = ("auto", "object_store", "collective")
OBJECT_STORE_BUFFERS = 2
"""Host buffers the object-store publisher alternates between (one being put, one cast)."""
_HEADER = 3  # int64: ok (1) or not held (0), version, nbytes


def resolve(transport: str, learner_gpus: float, consumer_gpus: Iterable[float]) -> str:
    """The transport a run uses: "auto" is collective when the learner and every consumer
    have a GPU (NCCL needs both ends on one), else the object store."""
    if transport != "auto":
        return transport
    on_gpus = learner_gpus > 0 and all(g > 0 for g in consumer_gpus)
    return "collective" if on_gpus else "object_store"


def backend_of(device: Any) -> str:
    """The collective backend of a process on `device`: nccl on a GPU, gloo on a CPU."""
    return "nccl" if str(device).startswith("cuda") else "gloo"


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


def pair_group(
    store: Any, rank: int, backend: str, device: Any, host: str, timeout_s: float
) -> Any:
    """A 2-rank process group on `store` (rank 0: the learner), built without the default
    process group (the learner's own FSDP group stays untouched): NCCL on `device` (a GPU),
    or gloo bound to `host`. Blocks until both ranks have joined."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":  # written for GPUs, not yet run on one
        gpu = torch.device(device)
        if gpu.index is not None:
            torch.cuda.set_device(gpu)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = _timedelta(timeout_s)
        return dist.ProcessGroupNCCL(store, rank, 2, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = _timedelta(timeout_s)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, 2, opts)


def _layer_of(name: str) -> str:
    """The decoder layer a tensor belongs to ("model.layers.7" of "model.layers.7.mlp..."),
    else its module path: what vLLM processes as one unit when it reloads weights."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return ".".join(parts[: i + 2])
    return ".".join(parts[:-1])


def plan_pieces(specs: tuple[TensorSpec, ...], piece_bytes: int) -> list[tuple[int, int]]:
    """Spec index ranges [lo, hi) a version is sent in: one piece when piece_bytes is 0,
    else whole decoder layers grouped up to piece_bytes (a larger layer is a piece alone),
    so a receiver never needs a whole version's memory and a loader that processes a layer
    once its last tensor arrives (vLLM) frees each piece soon after it arrived."""
    if piece_bytes <= 0 or not specs:
        return [(0, len(specs))]
    layers: list[tuple[int, int]] = []  # runs of consecutive specs of one layer
    for i, spec in enumerate(specs):
        if layers and _layer_of(spec.name) == _layer_of(specs[i - 1].name):
            layers[-1] = (layers[-1][0], i + 1)
        else:
            layers.append((i, i + 1))
    pieces = [layers[0]]
    for lo, hi in layers[1:]:
        if _span(specs, pieces[-1][0], hi) <= piece_bytes:
            pieces[-1] = (pieces[-1][0], hi)
        else:
            pieces.append((lo, hi))
    return pieces


def _span(specs: tuple[TensorSpec, ...], lo: int, hi: int) -> int:
    """Bytes of the buffer from spec lo's start to spec hi - 1's end."""
    hi = min(hi, len(specs))
    return specs[hi - 1].offset + specs[hi - 1].nbytes - specs[lo].offset


def _as_tensor(buffer: Any) -> Any:
    import torch

    return torch.from_numpy(buffer) if isinstance(buffer, np.ndarray) else buffer


def _sync(device: Any) -> None:
    """Wait for the device's queued work (a send or receive is done when this returns)."""
    if backend_of(device) == "nccl":
        import torch

        torch.cuda.current_stream().synchronize()


class Publisher:
    """The learner's side (rank 0): buffers, puts or held versions, and pairs.

    Thread-safe: the learner actor casts in its main thread and seals, retains and sends in
    the threads of its "weights" concurrency group."""

    def __init__(self, transport: str, device: Any, timeout_s: float = 300.0):
        if transport not in ("object_store", "collective"):
            raise ValueError(f"transport {transport!r}: expected object_store or collective")
        self.transport = transport
        self.device = device
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._free: list[Any] = []  # buffers nobody uses
        self._busy: dict[int, PackedWeights] = {}  # object_store: being put; collective: held
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
        if packed is not None:
            self._free.append(packed.buffer)
        self._cond.notify_all()

    # ---------------------------------------------------------------- object store

    def stage(self, packed: PackedWeights) -> None:
        """Mark a cast buffer as published (its put, or the sends of it, may begin)."""
        with self._cond:
            self._busy[packed.version] = packed

    def seal(self, version: int) -> WeightsHandle:
        """ray.put the staged version (a copy into the object store, off the critical path);
        its buffer is free again once the put is sealed."""
        import ray

        with self._cond:
            packed = self._busy[version]
        t0 = time.perf_counter()
        try:
            ref = ray.put(packed)
            self.last_put_s = time.perf_counter() - t0
        finally:
            with self._cond:
                self._release(version)
        return WeightsHandle(version, "object_store", packed.specs, packed.nbytes, ref=ref)

    # ---------------------------------------------------------------- collective

    def hold(self, packed: PackedWeights, source: Any) -> WeightsHandle:
        """Keep a cast version for the consumers to receive; its handle (manifest, learner)."""
        self._ensure_store()
        self.stage(packed)
        return WeightsHandle(
            packed.version, "collective", packed.specs, packed.nbytes,
            source=source, address=self.address, backend=backend_of(self.device),
            timeout_s=self.timeout_s,
        )  # fmt: skip

    def retain(self, versions: Iterable[int], seq: int = 0) -> list[int]:
        """Keep only `versions` (the driver's live ones and those a pending evaluation will
        load) and any published since (newer than all of them). `seq` orders the calls (they
        may run in parallel threads): an older call than one already applied is ignored.
        Returns the versions held afterwards (a version being sent stays until its send
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
            if not self._sending.get(v):
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
            import ray
            import torch.distributed as dist

            host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
            self._store = dist.TCPStore(
                host, 0, is_master=True, wait_for_workers=False,
                timeout=_timedelta(self.timeout_s),
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
        """Send a held version to the consumer end `key`: a header, then its bytes, in the
        pieces `plan_pieces(specs, piece_bytes)` makes (the receiver's plan); its size. A
        version no longer held is refused in the header, so the consumer does not hang."""
        import torch

        with self._cond:
            pg = self._pairs[key]
            packed = self._busy.get(version)
            if packed is not None:
                self._sending[version] = self._sending.get(version, 0) + 1
        ok = packed is not None
        nbytes = packed.nbytes if ok else 0
        header = torch.tensor([int(ok), version, nbytes], dtype=torch.int64)
        if backend_of(self.device) == "nccl":
            header = header.to(self.device)
        try:
            pg.send([header], 1, 0).wait()
            if not ok:
                raise KeyError(
                    f"weights version {version} is no longer held by the learner "
                    f"(held: {self.held()})"
                )
            whole = _as_tensor(packed.buffer)
            for lo, hi in plan_pieces(packed.specs, piece_bytes):
                start, end = packed.specs[lo].offset, _end(packed, hi)
                pg.send([whole[start:end]], 1, 1).wait()
            _sync(self.device)
        finally:
            if ok:
                with self._cond:
                    self._sending[version] -= 1
                    if not self._sending[version]:
                        del self._sending[version]
                    self._drop_unretained()
        return nbytes


def _end(packed: PackedWeights, hi: int) -> int:
    """Where piece [.., hi) ends: the next spec's start, or the buffer's end."""
    return packed.specs[hi].offset if hi < len(packed.specs) else packed.nbytes


class PairEnd:
    """A consumer's end of its pair with the learner (rank 1), and the receive buffer it
    reuses for every version: on the consumer's GPU for NCCL, in host memory for gloo (a
    GPU consumer of a CPU learner then loads host to device)."""

    def __init__(
        self, address: str, key: str, backend: str, device: Any, timeout_s: float, host: str
    ):
        import torch.distributed as dist

        server, port = address.rsplit(":", 1)
        self.backend = backend
        self.device = device if backend == "nccl" else "cpu"
        self._store = dist.TCPStore(server, int(port), is_master=False,
                                    timeout=_timedelta(timeout_s))  # fmt: skip
        self.pg = pair_group(
            dist.PrefixStore(f"opdflow/{key}/", self._store), 1, backend, self.device, host,
            timeout_s,
        )  # fmt: skip
        self._buffer: Any = None

    def receive(self, version: int, specs: tuple[TensorSpec, ...], nbytes: int) -> PackedWeights:
        """Receive `version` whole into the reused buffer; a packed view of it (valid until
        the next receive)."""
        return next(self.receive_pieces(version, specs, nbytes, 0, reuse=True))

    def receive_pieces(
        self,
        version: int,
        specs: tuple[TensorSpec, ...],
        nbytes: int,
        piece_bytes: int,
        reuse: bool = False,
    ) -> Iterator[PackedWeights]:
        """Receive `version` piece by piece (`plan_pieces`), yielding each piece as a packed
        view (its specs' offsets relative to the piece). Each piece gets its own buffer,
        freed once nothing views it: a loader may hold some tensors back (vLLM finishes a
        padded layer, such as a vocabulary padded to a multiple of 64, only at the end).
        reuse=True receives into one buffer kept for every version instead (consume each
        piece before advancing)."""
        import torch

        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        self.pg.recv([header], 0, 0).wait()
        ok, got, size = (int(x) for x in header.cpu())
        if not ok or got != version or size != nbytes:
            raise RuntimeError(
                f"weights version {version} ({nbytes} bytes) was asked for, the learner "
                f"answered {'version ' + str(got) if ok else 'that it no longer holds it'}"
            )
        plan = [(lo, hi, specs[lo].offset, _end_of(specs, nbytes, hi))
                for lo, hi in plan_pieces(specs, piece_bytes)]  # fmt: skip
        largest = max(end - start for _, _, start, end in plan)
        if reuse and (self._buffer is None or self._buffer.nbytes < largest):
            self._buffer = None
            self._buffer = torch.empty(largest, dtype=torch.uint8, device=self.device)
        for lo, hi, start, end in plan:
            if reuse:
                piece = self._buffer[: end - start]
            else:
                piece = torch.empty(end - start, dtype=torch.uint8, device=self.device)
            self.pg.recv([piece], 0, 1).wait()
            _sync(self.device)
            local = tuple(
                dataclasses.replace(spec, offset=spec.offset - start) for spec in specs[lo:hi]
            )
            yield PackedWeights(version, local, piece.numpy() if self.backend == "gloo" else piece)


def _end_of(specs: tuple[TensorSpec, ...], nbytes: int, hi: int) -> int:
    return specs[hi].offset if hi < len(specs) else nbytes


class Receiver(Protocol):
    """Where a consumer's weights are received and loaded: in its own process (`LocalReceiver`)
    or in an engine's workers (VLLMEngine, through its worker extension)."""

    piece_bytes: int
    """Pieces it receives a version in (`plan_pieces`; 0: whole, into one buffer)."""

    def pair_owners(self) -> list[str]:
        """One stable id per end that receives (a process; vLLM: each of its workers)."""
        ...

    def join(self, address: str, keys: list[str], backend: str, timeout_s: float) -> None:
        """Open each end's pair (`keys` in `pair_owners` order); blocks until joined."""
        ...

    def receive(self, version: int, specs: tuple[TensorSpec, ...], nbytes: int) -> None:
        """Receive `version` on every end and load it into the model."""
        ...


class LocalReceiver:
    """Receives in this process, whole, and loads with `load(views, version)`."""

    piece_bytes = 0

    def __init__(self, load: Callable[[dict[str, Any], int], None], device: Any):
        self.load = load
        self.device = device
        self.end: PairEnd | None = None

    def pair_owners(self) -> list[str]:
        return [process_id()]

    def join(self, address: str, keys: list[str], backend: str, timeout_s: float) -> None:
        self.end = PairEnd(address, keys[0], backend, self.device, timeout_s, node_ip())

    def receive(self, version: int, specs: tuple[TensorSpec, ...], nbytes: int) -> None:
        assert self.end is not None
        self.load(views(self.end.receive(version, specs, nbytes)), version)


def node_ip() -> str:
    """This process's node address (what a gloo pair binds to)."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def process_id() -> str:
    """A stable id of this consumer end: its Ray actor's id (the same after a restart, so
    the learner replaces the dead pair), else host and pid."""
    import os

    import ray

    if ray.is_initialized():
        actor = ray.get_runtime_context().get_actor_id()
        if actor:
            return str(actor)
    return f"{node_ip()}-{os.getpid()}"


class Fetcher:
    """A consumer actor's side: resolves a handle and gets the version's bytes into its model."""

    def __init__(self) -> None:
        self._joined: tuple[str | None, int] | None = None  # (learner address, receiver id)

    def fetch(
        self,
        handle: WeightsHandle,
        load: Callable[[dict[str, Any], int], None],
        receiver: Receiver | None,
    ) -> None:
        """Load `handle`'s version: zero-copy views of the object-store buffer, or a receive
        on this consumer's pair with the learner (opened at the first collective fetch)."""
        import ray

        if handle.transport == "object_store":
            load(views(ray.get(handle.ref)), handle.version)
            return
        if receiver is None:
            raise RuntimeError("a collective weights version needs a receiver in the consumer")
        source = handle.source
        if self._joined != (handle.address, id(receiver)):
            owners = receiver.pair_owners()
            keys = [f"{owner}/{uuid.uuid4().hex}" for owner in owners]
            opened = [source.open_pair.remote(k, o) for k, o in zip(keys, owners)]
            receiver.join(str(handle.address), keys, str(handle.backend), handle.timeout_s)
            ray.get(opened)
            self._joined = (handle.address, id(receiver))
            self._keys = keys
        piece = receiver.piece_bytes
        sent = [source.send_weights.remote(handle.version, k, piece) for k in self._keys]
        try:
            receiver.receive(handle.version, handle.specs, handle.nbytes)
        except BaseException:
            ray.get(sent, timeout=handle.timeout_s)  # the learner's reason, when it has one
            raise
        ray.get(sent)


def fetch_state(box_or_ref: Any) -> dict[str, Any]:
    """A published object-store version as zero-copy tensor views, from the driver or a test."""
    import ray

    ref = box_or_ref[0] if isinstance(box_or_ref, list) else box_or_ref
    handle = ray.get(ref)
    if handle.transport != "object_store":
        raise ValueError("fetch_state reads object-store versions; a collective one is received")
    return views(ray.get(handle.ref))


def put_version(packed: PackedWeights) -> Any:
    """Publish a packed version through the object store from a driver or a test: the ref
    consumers take (it resolves to the version's WeightsHandle)."""
    import ray

    handle = WeightsHandle(
        packed.version, "object_store", packed.specs, packed.nbytes, ref=ray.put(packed)
    )
    return ray.put(handle)
