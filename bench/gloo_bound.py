"""The collective's bound on this machine: one bare gloo message between two actors.

    PYTHONPATH=. python bench/gloo_bound.py [--gb 1.5] [--repeats 3]

Two actors join a 2-rank gloo group as the collective's pairs do (weights/pair.py:
`pair_group`); rank 0 sends a buffer of the given size to rank 1 in one message, from a
buffer into a buffer, no copy at either end. Rank 1 times it from posting its receive.
Next to each, a single-thread memcpy of the same bytes (the ratio bench/weight_broadcast.py
reports its fetches against): medians over --repeats after one warm-up. Whatever the
collective's fetch + load costs above this is the weight path's own; this is loopback TCP.
bench/weight_broadcast.py runs it after the collective (its `bound:` line).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np


class WireEnd:
    """One rank of a bare gloo pair (pair.pair_group, as the collective's), for the bound."""

    def __init__(self, nbytes: int):
        self.buffer = np.empty(nbytes, dtype=np.uint8)
        self.buffer.fill(7)  # pages mapped before anything is timed
        self.pg: Any = None
        self.store: Any = None

    def address(self) -> str:
        import torch.distributed as dist

        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        return f"127.0.0.1:{self.store.port}"

    def join(self, address: str, rank: int) -> None:
        import torch.distributed as dist

        from opdflow.weights.pair import pair_group

        if self.store is None:
            host, port = address.rsplit(":", 1)
            self.store = dist.TCPStore(host, int(port), is_master=False)
        self.pg = pair_group(self.store, rank, "gloo", "cpu", "127.0.0.1", 300)

    def move(self, rank: int) -> float:
        """Seconds of one message of the whole buffer (rank 1: from posting its receive)."""
        import torch

        ready = torch.zeros(1)
        if rank == 0:
            self.pg.recv([ready], 1, 0).wait()
            self.pg.send([torch.from_numpy(self.buffer)], 1, 1).wait()
            return 0.0
        t0 = time.perf_counter()
        work = self.pg.recv([torch.from_numpy(self.buffer)], 0, 1)
        self.pg.send([ready], 0, 0).wait()
        work.wait()
        return time.perf_counter() - t0


def measure(nbytes: int, repeats: int, memcpy: Memcpy) -> dict[str, Any]:
    """One gloo message of `nbytes` between two actors, next to `memcpy()` (a memcpy of the
    same bytes) run right before each: medians of `repeats`, one warm-up. Needs a
    connected Ray."""
    import ray

    ends = [ray.remote(WireEnd).options(num_cpus=0).remote(nbytes) for _ in range(2)]
    address = ray.get(ends[0].address.remote())
    ray.get([end.join.remote(address, rank) for rank, end in enumerate(ends)])
    rows = []
    for _ in range(repeats + 1):
        mc = memcpy()
        _, seconds = ray.get([end.move.remote(rank) for rank, end in enumerate(ends)])
        rows.append({"memcpy_s": mc, "wire_s": seconds})
    for end in ends:
        ray.kill(end)
    timed = rows[1:]
    return {
        "gb": nbytes / 1e9,
        "wire_s": statistics.median(r["wire_s"] for r in timed),
        "wire_over_memcpy": statistics.median(r["wire_s"] / r["memcpy_s"] for r in timed),
        "rows": rows,
    }


def print_bound(bound: dict[str, Any]) -> None:
    print(f"bound: one gloo message of {bound['gb']:.2f} GB over loopback, no copy at either "
          f"end: {bound['wire_s']:.3f} s, {bound['wire_over_memcpy']:.2f}x memcpy", flush=True)  # fmt: skip


class Memcpy:
    """Single-thread np.copyto of `nbytes` between two buffers faulted in once: what the
    ratios here and in bench/weight_broadcast.py are taken against."""

    def __init__(self, nbytes: int):
        self.src = np.empty(nbytes, dtype=np.uint8)
        self.src.fill(7)
        self.dst = np.empty_like(self.src)
        np.copyto(self.dst, self.src)

    def __call__(self) -> float:
        t0 = time.perf_counter()
        np.copyto(self.dst, self.src)
        return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.5, help="Message size in GB.")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    import ray

    from opdflow.cluster.connection import connect

    connect(2)
    nbytes = int(args.gb * 1e9)
    print_bound(measure(nbytes, args.repeats, Memcpy(nbytes)))
    ray.shutdown()


if __name__ == "__main__":
    main()
