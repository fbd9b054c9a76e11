"""The collective transport's pairs: a 2-rank torch.distributed group per consumer end.

A consumer end (a process: a stage actor, or each worker of a vLLM engine) pairs with the
learner once and receives every version it needs on that pair: rank 0 the learner, rank 1
the consumer, rendezvous on the learner's TCPStore, NCCL between GPUs, gloo on CPUs.
Pairs rather than one static group: a consumer that restarts or that the generator pool
adds just opens its own pair, and the learner's own FSDP process group stays untouched.
Each version starts with a header (`HEADER`), then moves in buckets (bucket.py). The
learner's side is publisher.py; the consumer's fetcher.py.
"""

from __future__ import annotations

import datetime
from typing import Any

HEADER = ("ok", "version", "nbytes", "bucket_bytes")
"""int64s before a version's buckets: ok (1) or not held (0), version, its bytes, bucket size."""
HEADER_TAG = 0
"""The header's tag; bucket i goes with tag BUCKET_TAG + i."""
BUCKET_TAG = 1


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

    from opdflow.compute.interfaces import bind_sockets

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


class PairEnd:
    """A consumer's end of its pair with the learner (rank 1): its group, and the header
    each version begins with."""

    def __init__(
        self, address: str, key: str, backend: str, device: Any, timeout_s: float, host: str
    ):
        import torch.distributed as dist

        from opdflow.weights.memory import WeightMemory

        server, port = address.rsplit(":", 1)
        self.backend = backend
        self.memory = WeightMemory(device)
        """The consumer's device: buckets arrive there over NCCL, in host memory over gloo."""
        wire = device if backend == "nccl" else "cpu"
        self._store = dist.TCPStore(server, int(port), is_master=False,
                                    timeout=as_timedelta(timeout_s))  # fmt: skip
        self.pg = pair_group(
            dist.PrefixStore(f"opdflow/{key}/", self._store), 1, backend, wire, host, timeout_s
        )  # fmt: skip
        self.wire_device = wire
        self._whole: Any = None

    def expect(self, version: int, nbytes: int, bucket_bytes: int) -> None:
        """Receive a version's header; raise unless it announces `version` as asked."""
        import torch

        header = torch.zeros(len(HEADER), dtype=torch.int64, device=self.wire_device)
        self.pg.recv([header], 0, HEADER_TAG).wait()
        ok, got, size, bucket = (int(x) for x in header.cpu())
        if not ok or got != version or size != nbytes or bucket != bucket_bytes:
            raise RuntimeError(
                f"weights version {version} ({nbytes} bytes in buckets of {bucket_bytes}) was "
                "asked for, the learner answered "
                + (f"version {got} ({size} bytes in buckets of {bucket})" if ok
                   else "that it no longer holds it")
            )  # fmt: skip

    def whole_buffer(self, nbytes: int) -> Any:
        """A host buffer for a whole version, reused for every version that is received
        whole (a reader that cannot take the buckets straight): only buckets touch the
        consumer's GPU, never a whole version."""
        import torch

        if self._whole is None or self._whole.nbytes != nbytes:
            self._whole = None
            self._whole = torch.empty(nbytes, dtype=torch.uint8)
        return self._whole


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
