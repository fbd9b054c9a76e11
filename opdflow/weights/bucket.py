"""Buckets: how the collective moves a version, in fixed-size pieces through two buffers.

A version's bytes move from the learner's host staging to a consumer end in buckets: byte
ranges of `bucket_bytes` of its flat buffer (`plan`; the last one shorter), at most two in
flight (`BucketSender`). Over NCCL each bucket is first copied into one of two buffers on
the learner's GPU (memory.py) and sent while the next is copied into the other; a buffer
is refilled only once the bucket it held has left. So the learner's device holds two
buckets for the collective, never a version (a 15 GB 7B version in 256 MiB buckets:
512 MiB). Over gloo the staging already is where the wire reads: its slices are sent as
they are (the same double-buffered order, no copy). One bucket goes to every end of one
fetch (a vLLM engine's tensor-parallel workers) before the next.

A tensor may straddle buckets. A consumer takes the buckets either straight into their
place (`receive_into`: its parameters laid out flat like the version, loader.FlatLayout;
at most two receives in flight), or as whole tensors handed out once their last byte is
in (`receive_tensors` with `Unpacker`: vLLM's reload path, where each tensor-parallel
worker keeps its shard of each). `IncomingVersion` is a version still on its pair, as the
mapping a consumer's load function takes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

from opdflow.weights.loader import copy_bytes
from opdflow.weights.pair import BUCKET_TAG, HEADER_TAG, PairEnd
from opdflow.weights.version import ALIGN, PackedWeights, TensorSpec, VersionViews, typed, views


def plan(nbytes: int, bucket_bytes: int) -> list[tuple[int, int]]:
    """[start, end) byte ranges of a version of `nbytes` in buckets of `bucket_bytes` (a
    multiple of ALIGN, so a tensor's view inside a bucket stays aligned)."""
    if bucket_bytes <= 0 or bucket_bytes % ALIGN:
        raise ValueError(f"bucket_bytes must be a positive multiple of {ALIGN}, got {bucket_bytes}")
    return [(s, min(s + bucket_bytes, nbytes)) for s in range(0, nbytes, bucket_bytes)]


class BucketSender:
    """The learner's side of the buckets: the two bucket buffers on the wire device where
    buckets are staged (kept for every send, so the bound holds across versions and
    consumers: sends run one fetch at a time, publisher.py), and the side stream their
    copies and sends run on (CUDA)."""

    def __init__(self, memory: Any, backend: str, bucket_bytes: int):
        self.memory = memory
        self.backend = backend
        self.bucket_bytes = bucket_bytes
        self.staged = memory.staged_buckets(backend)
        """Copy each bucket into a wire buffer first (NCCL), else send staging slices."""
        self._buffers: list[Any] = []
        self._stream: Any = None

    def _buffers_for(self, largest: int) -> list[Any]:
        size = min(self.bucket_bytes, max(largest, 1))
        if not self._buffers or self._buffers[0].numel() < size:
            self._buffers = []  # the old pair goes before the new one is made
            self._buffers = [self.memory.wire(size, self.backend) for _ in range(2)]
        return self._buffers

    def send(self, groups: list[Any], header: Any, staging: Any = None) -> None:
        """Send `header` (int64s), then `staging` (a host uint8 tensor) bucket by bucket, to
        rank 1 of every group; returns once every bucket has left and staging may be reused.

        Double-buffered: at most two buckets in flight; a staged bucket i + 1 is copied into
        the other buffer while bucket i is sent. On CUDA the copies and sends are ordered on
        this sender's side stream (a send waits for its bucket's copy, a refill for the send
        that read the buffer), never on the stream training uses."""
        mem = self.memory
        if self._stream is None:
            self._stream = mem.side_stream()
        on_gpu = self.backend == "nccl"
        with mem.on(self._stream):
            head = header.to(mem.device) if on_gpu else header
            for pg in groups:
                pg.send([head], 1, HEADER_TAG).wait()
            if staging is None:
                return
            ranges = plan(int(staging.numel()), self.bucket_bytes)
            if self.staged:
                buffers = self._buffers_for(max((e - s for s, e in ranges), default=0))
            inflight: list[list[Any]] = [[], []]
            for i, (s, e) in enumerate(ranges):
                slot = i % 2
                for work in inflight[slot]:  # the bucket this slot held has left
                    work.wait()
                bucket = staging[s:e]
                if self.staged:
                    bucket = buffers[slot][: e - s]
                    if on_gpu:
                        bucket.copy_(staging[s:e], non_blocking=True)
                    else:
                        copy_bytes(bucket, staging[s:e])
                inflight[slot] = [pg.send([bucket], 1, BUCKET_TAG + i) for pg in groups]
            for works in inflight:
                for work in works:
                    work.wait()
            mem.synchronize(mem.mark(self._stream))

    def held_bytes(self) -> int:
        """Bytes of the bucket buffers this sender keeps (at most 2 x bucket_bytes)."""
        return sum(int(b.numel()) for b in self._buffers)


def receive_into(end: PairEnd, dest: Any, bucket_bytes: int) -> None:
    """Receive a version's buckets (after its header) straight into `dest`, a uint8 tensor
    of the version's size: at most two receives in flight. When `dest` is not on the wire
    device (a gloo pair into a GPU consumer's parameters, an NCCL pair into host memory),
    each bucket lands in one of two buffers on the wire device first and is copied on."""
    ranges = plan(int(dest.numel()), bucket_bytes)
    if dest.device.type == ("cuda" if end.backend == "nccl" else "cpu"):
        inflight: deque = deque()
        for i, (s, e) in enumerate(ranges):
            inflight.append(end.pg.recv([dest[s:e]], 0, BUCKET_TAG + i))
            if len(inflight) > 2:
                inflight.popleft().wait()
        while inflight:
            inflight.popleft().wait()
    else:
        size = min(bucket_bytes, int(dest.numel()))
        bounce = [end.memory.wire(size, end.backend) for _ in range(2)]
        for _, buf, s, e in _received(end, ranges, lambda i: bounce[i % 2]):
            dest[s:e].copy_(buf[: e - s])
    end.memory.synchronize(end.memory.mark())


def _received(end: PairEnd, ranges: list[tuple[int, int]], buffer_of: Any) -> Iterator:
    """(i, buffer, start, end) of each bucket once it is in; bucket i + 1's receive is
    posted before bucket i is handed out."""
    works: dict[int, tuple[Any, Any]] = {}

    def post(i: int) -> None:
        if i < len(ranges):
            buf = buffer_of(i)
            s, e = ranges[i]
            works[i] = (end.pg.recv([buf[: e - s]], 0, BUCKET_TAG + i), buf)

    post(0)
    for i, (s, e) in enumerate(ranges):
        work, buf = works.pop(i)
        work.wait()
        post(i + 1)
        yield i, buf, s, e


class Unpacker:
    """Whole tensors out of a version's buckets, in manifest order: a tensor inside one
    bucket is a view of it; one that straddles buckets is assembled in its own buffer."""

    def __init__(self, specs: tuple[TensorSpec, ...], device: Any):
        self.specs = specs
        self.device = device
        self._next = 0
        self._partial: tuple[TensorSpec, Any] | None = None

    def take(self, buf: Any, start: int, end: int) -> list[tuple[str, Any]]:
        """The tensors completed by bucket [start, end) held in `buf` (as (name, tensor))."""
        import torch

        out = []
        if self._partial is not None:
            spec, raw = self._partial
            hi = min(spec.offset + spec.nbytes, end)
            raw[start - spec.offset : hi - spec.offset].copy_(buf[: hi - start])
            if hi == spec.offset + spec.nbytes:
                out.append((spec.name, typed(raw, spec)))
                self._partial = None
        while self._partial is None and self._next < len(self.specs):
            spec = self.specs[self._next]
            if spec.offset >= end and spec.nbytes:
                break
            self._next += 1
            lo, hi = spec.offset - start, spec.offset + spec.nbytes - start
            if spec.offset + spec.nbytes <= end:
                out.append((spec.name, typed(buf[lo:hi], spec)))
            else:
                raw = torch.empty(spec.nbytes, dtype=torch.uint8, device=self.device)
                raw[: end - spec.offset].copy_(buf[lo:])
                self._partial = (spec, raw)
        return out


def receive_tensors(
    end: PairEnd, specs: tuple[TensorSpec, ...], nbytes: int, bucket_bytes: int
) -> Iterator[tuple[str, Any]]:
    """A version's tensors (after its header) as they arrive: each bucket in a buffer of its
    own, freed once nothing views it (a loader may hold tensors back: vLLM finishes a padded
    layer only at the end), so the consumer holds about two buckets plus what it keeps."""
    ranges = plan(nbytes, bucket_bytes)
    unpack = Unpacker(specs, end.wire_device)

    def fresh(i: int) -> Any:
        s, e = ranges[i]
        return end.memory.wire(e - s, end.backend)

    for _, buf, s, e in _received(end, ranges, fresh):
        yield from unpack.take(buf, s, e)
    end.memory.synchronize(end.memory.mark())


class IncomingVersion(Mapping):
    """A version still on its pair, as the mapping a consumer's load function takes.

    `loader.load_module` receives it straight into a module laid out flat like it
    (`receive_into`); anything else that reads it (a name, its items) gets the whole
    version received into one host buffer first (reused across versions; on a GPU through
    two device buckets), then zero-copy views of it. `finish` drains a version nobody read, so the learner's
    send never hangs."""

    def __init__(self, end: PairEnd, version: int, specs: tuple[TensorSpec, ...], nbytes: int,
                 bucket_bytes: int):  # fmt: skip
        self.end = end
        self.version = version
        self.specs = specs
        self.nbytes = nbytes
        self.bucket_bytes = bucket_bytes
        self._views: VersionViews | None = None

    def receive_into(self, dest: Any) -> None:
        """Receive every bucket straight into `dest` (uint8, the version's size)."""
        if self._views is not None:
            raise RuntimeError(f"weights version {self.version} was already received")
        receive_into(self.end, dest, self.bucket_bytes)
        self._views = views(PackedWeights(self.version, self.specs, dest))

    def _whole(self) -> VersionViews:
        if self._views is None:
            self.receive_into(self.end.whole_buffer(self.nbytes))
        assert self._views is not None
        return self._views

    def __getitem__(self, name: str) -> Any:
        return self._whole()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self.specs)

    def finish(self) -> None:
        """Receive the version if no one has (its bytes must leave the pair)."""
        self._whole()
