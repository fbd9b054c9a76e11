"""The collective transport's pairs: a 2-rank torch.distributed group per consumer end.

A consumer end (a process: a stage actor, or each worker of a vLLM engine) pairs with the
learner once and receives every version it needs on that pair: rank 0 the learner, rank 1
the consumer, rendezvous on the learner's TCPStore, NCCL between GPUs, gloo on CPUs (on
GPUs nothing goes through host memory). Pairs rather than one static group: a consumer
that restarts or that the generator pool adds just opens its own pair, and the learner's
own FSDP process group stays untouched. A version is sent whole, or in pieces of whole
decoder layers (`plan_pieces`) for a receiver short of memory (a vLLM worker, whose GPU is
mostly KV cache). The learner's side is publisher.py; the consumer's fetcher.py.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator
from typing import Any

from opdflow.runtime.weights import PackedWeights, TensorSpec

HEADER_LEN = 3
"""int64s before a version's bytes: ok (1) or not held (0), version, nbytes."""


def backend_of(device: Any) -> str:
    """The collective backend of a process on `device`: nccl on a GPU, gloo on a CPU."""
    return "nccl" if str(device).startswith("cuda") else "gloo"


def as_timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def pair_group(
    store: Any, rank: int, backend: str, device: Any, host: str, timeout_s: float
) -> Any:
    """A 2-rank process group on `store` (rank 0: the learner), built without the default
    process group (the learner's own FSDP group stays untouched): NCCL on `device` (a GPU),
    or gloo; either binds the interface holding `host`, the node's address. Blocks until
    both ranks have joined."""
    import torch
    import torch.distributed as dist

    from opdflow.runtime.interfaces import bind_sockets

    bind_sockets(backend, host)  # NCCL's bootstrap too binds the interface holding `host`
    if backend == "nccl":  # written for GPUs, not yet run on one
        gpu = torch.device(device)
        if gpu.index is not None:
            torch.cuda.set_device(gpu)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = as_timedelta(timeout_s)
        return dist.ProcessGroupNCCL(store, rank, 2, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = as_timedelta(timeout_s)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, 2, opts)


def sync_device(device: Any) -> None:
    """Wait for the device's queued work (a send or receive is done when this returns)."""
    if backend_of(device) == "nccl":
        import torch

        torch.cuda.current_stream().synchronize()


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


def piece_end(specs: tuple[TensorSpec, ...], hi: int, nbytes: int) -> int:
    """Where a piece of specs [.., hi) ends in a buffer of `nbytes`: the next spec's start,
    or the buffer's end."""
    return specs[hi].offset if hi < len(specs) else nbytes


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
                                    timeout=as_timedelta(timeout_s))  # fmt: skip
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

        header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=self.device)
        self.pg.recv([header], 0, 0).wait()
        ok, got, size = (int(x) for x in header.cpu())
        if not ok or got != version or size != nbytes:
            raise RuntimeError(
                f"weights version {version} ({nbytes} bytes) was asked for, the learner "
                f"answered {'version ' + str(got) if ok else 'that it no longer holds it'}"
            )
        plan = [(lo, hi, specs[lo].offset, piece_end(specs, hi, nbytes))
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
            sync_device(self.device)
            local = tuple(
                dataclasses.replace(spec, offset=spec.offset - start) for spec in specs[lo:hi]
            )
            yield PackedWeights(version, local, piece.numpy() if self.backend == "gloo" else piece)


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
