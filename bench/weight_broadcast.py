"""Weight publishing through Ray's object store (and a gloo broadcast) next to a plain memcpy.

    PYTHONPATH=. python bench/weight_broadcast.py [--gb 1.5,15] [--part-gb 1.5] [--repeats 3]
    PYTHONPATH=. python bench/weight_broadcast.py --quick      # CI size: seconds

A bf16 state (tensors of 4M elements, like a model's layers) goes the way the learner ships
weights: publish = opdflow.weights.pack + ray.put in one actor; fetch = ray.get + unpack
in another actor on the same node (what a generator does). A state larger than --part-gb
is published as parts of at most --part-gb each, one after the other, each part fetched
and released before the next is put: a 15 GB-equivalent state is 10 x 1.5 GB through the
store, so the store holds one part (not 15 GB) and the bench fits a 24 GiB machine. Its
seconds are the sum over the parts. With --collective the same parts also go by
torch.distributed broadcast (gloo, loopback TCP) between two actors: pack, broadcast
into a receive buffer the receiver allocated once, unpack.

Reference: single-thread np.copyto of the same bytes (of one part, times the parts).
Medians of --repeats (after one warm-up); ratios are seconds / memcpy seconds. Memory:
peak plasma bytes seen right after each put, and each process's peak RSS (which counts
the plasma pages it touched).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
import socket
import statistics
import time
from typing import Any

import numpy as np

GB = 1e9
TENSOR_ELEMENTS = 4 * 2**20


def make_state(nbytes: int) -> dict:
    """A bf16 state dict of `nbytes` bytes: 4M-element tensors (pages touched), one random
    tensor cloned (content does not change copy speed; cloning is faster than sampling)."""
    import torch

    n = nbytes // 2
    base = torch.randn(min(TENSOR_ELEMENTS, n)).to(torch.bfloat16)
    state, i = {}, 0
    while n > 0:
        m = min(TENSOR_ELEMENTS, n)
        state[f"layer{i}.weight"] = base[:m].clone()
        n -= m
        i += 1
    return state


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Publisher:
    """The learner's side: holds one part's state; packs and puts it (or broadcasts it)."""

    def __init__(self, part_bytes: int):
        import torch

        torch.set_num_threads(1)
        self.state = make_state(part_bytes)
        self.packed = None

    def publish(self) -> list:
        import ray

        from opdflow.weights import pack

        t0 = time.perf_counter()
        packed = pack(self.state, 1)
        t1 = time.perf_counter()
        ref = ray.put(packed)
        t2 = time.perf_counter()
        return [ref, t1 - t0, t2 - t1, packed.nbytes]

    def join(self, port: int) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=2)  # fmt: skip

    def pack(self) -> float:
        from opdflow.weights import pack

        t0 = time.perf_counter()
        self.packed = pack(self.state, 1)
        return time.perf_counter() - t0

    def broadcast(self) -> float:
        import torch
        import torch.distributed as dist

        t0 = time.perf_counter()
        dist.broadcast(torch.from_numpy(self.packed.buffer), src=0)
        dt = time.perf_counter() - t0
        self.packed = None
        return dt

    def peak_rss(self) -> int:
        return peak_rss_bytes()


class Fetcher:
    """A generator's side: gets and unpacks a part (or receives it by broadcast)."""

    def __init__(self):
        import torch

        torch.set_num_threads(1)
        self.buf = None
        self.specs = None

    def fetch(self, box: list) -> tuple[float, float]:
        import ray

        from opdflow.weights import unpack

        t0 = time.perf_counter()
        packed = ray.get(box[0])
        t1 = time.perf_counter()
        state = unpack(packed)
        t2 = time.perf_counter()
        assert len(state) == len(packed.specs)
        self.specs = packed.specs  # the manifest the broadcast receiver reuses
        return t1 - t0, t2 - t1

    def join(self, port: int, nbytes: int) -> None:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1,
                                world_size=2)  # fmt: skip
        self.buf = torch.empty(nbytes, dtype=torch.uint8)  # allocated once per run
        self.buf.fill_(0)

    def receive(self) -> tuple[float, float]:
        import torch.distributed as dist

        from opdflow.weights import PackedWeights, unpack

        t0 = time.perf_counter()
        dist.broadcast(self.buf, src=0)
        t1 = time.perf_counter()
        state = unpack(PackedWeights(1, self.specs, self.buf.numpy()))
        t2 = time.perf_counter()
        assert len(state) == len(self.specs)
        return t1 - t0, t2 - t1

    def peak_rss(self) -> int:
        return peak_rss_bytes()


def memcpy_s(nbytes: int, repeats: int) -> float:
    """Median seconds of one single-thread np.copyto of `nbytes` (pages faulted in first)."""
    src = np.empty(nbytes, dtype=np.uint8)
    src.fill(7)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def plasma_used_bytes() -> tuple[float, float]:
    """(plasma bytes in use, bytes spilled so far) from Ray's memory summary."""
    import ray
    from ray._private.internal_api import memory_summary

    text = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    used = re.search(r"Plasma memory usage ([\d.]+) MiB", text)
    spilled = re.search(r"Spilled ([\d.]+) MiB", text)
    mib = 2**20
    return (float(used.group(1)) * mib if used else 0.0,
            float(spilled.group(1)) * mib if spilled else 0.0)  # fmt: skip


def mem_available_bytes() -> int:
    """MemAvailable of the whole machine (/proc/meminfo)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


class MemoryWatch:
    """Peak drop of the machine's available memory below its value at start, sampled every
    0.1 s in a thread: what the bench adds to the machine (other processes add noise)."""

    def __init__(self) -> None:
        import threading

        self.base = mem_available_bytes()
        self.low = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            self.low = min(self.low, mem_available_bytes())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return float(self.base - self.low)


def wait_freed(below_bytes: float, timeout_s: float = 10.0) -> None:
    """Untimed: wait until Ray has freed released parts (it frees in batches about once a
    second), so the store holds one part at a time."""
    t_end = time.perf_counter() + timeout_s
    while plasma_used_bytes()[0] > below_bytes and time.perf_counter() < t_end:
        time.sleep(0.05)


LARGE_PART = 2**28
"""Parts at least this large wait (untimed) for the previous one to be freed."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _median(rows: list[list[float]]) -> list[float]:
    return [statistics.median(col) for col in zip(*rows)]


def measure(
    total_bytes: int, part_bytes: int, repeats: int, collective: bool = False
) -> dict[str, Any]:
    """One size: object-store publish/fetch (and optionally gloo broadcast) vs memcpy.

    Needs a connected Ray. Returns seconds (medians, summed over parts), GB/s, ratios to
    memcpy and memory figures."""
    import ray

    watch = MemoryWatch()
    parts = max(1, math.ceil(total_bytes / part_bytes))
    part = total_bytes // parts // 2 * 2  # whole bf16 elements
    opts = {"num_cpus": 0}
    pub = ray.remote(Publisher).options(**opts).remote(part)
    fet = ray.remote(Fetcher).options(**opts).remote()
    plasma_peak, spilled = 0.0, 0.0
    store_rows = []  # per repeat: pack, put, get, unpack (seconds, summed over parts)
    for _ in range(repeats + 1):  # the first is a warm-up
        sums = [0.0] * 4
        for _ in range(parts):
            ref, pack_s, put_s, nbytes = ray.get(pub.publish.remote())
            used, spilled = plasma_used_bytes()
            plasma_peak = max(plasma_peak, used)
            get_s, unpack_s = ray.get(fet.fetch.remote([ref]))
            del ref  # released before the next part is put
            if part >= LARGE_PART:
                wait_freed(0.5 * part)
            for i, x in enumerate((pack_s, put_s, get_s, unpack_s)):
                sums[i] += x
        store_rows.append(sums)
    pack_s, put_s, get_s, unpack_s = _median(store_rows[1:])
    out: dict[str, Any] = {
        "gb": parts * nbytes / GB,
        "parts": parts,
        "part_gb": nbytes / GB,
        "repeats": repeats,
        "pack_s": pack_s,
        "put_s": put_s,
        "get_s": get_s,
        "unpack_s": unpack_s,
        "publish_s": pack_s + put_s,
        "fetch_s": get_s + unpack_s,
    }
    if collective:
        port = _free_port()
        ray.get([pub.join.remote(port), fet.join.remote(port, nbytes)])
        coll_rows = []
        for _ in range(repeats + 1):
            sums = [0.0] * 3
            for _ in range(parts):
                sums[0] += ray.get(pub.pack.remote())
                send, (recv, unpack) = ray.get([pub.broadcast.remote(), fet.receive.remote()])
                sums[1] += max(send, recv)
                sums[2] += unpack
            coll_rows.append(sums)
        c_pack, c_bcast, c_unpack = _median(coll_rows[1:])
        out.update(coll_pack_s=c_pack, coll_bcast_s=c_bcast, coll_unpack_s=c_unpack,
                   coll_total_s=c_pack + c_bcast + c_unpack)  # fmt: skip
    out["peak_rss_publisher_gb"] = ray.get(pub.peak_rss.remote()) / GB
    out["peak_rss_fetcher_gb"] = ray.get(fet.peak_rss.remote()) / GB
    ray.kill(pub)
    ray.kill(fet)
    out["plasma_peak_gb"] = plasma_peak / GB
    out["spilled_gb"] = spilled / GB
    out["machine_mem_growth_gb"] = watch.stop() / GB  # memcpy's buffers come after
    mc = memcpy_s(nbytes, repeats) * parts
    out["memcpy_s"] = mc
    out["peak_rss_driver_gb"] = peak_rss_bytes() / GB
    for key in ("publish", "fetch", "coll_total"):
        if f"{key}_s" in out:
            out[f"{key}_gbps"] = out["gb"] / out[f"{key}_s"]
            out[f"{key}_over_memcpy"] = out[f"{key}_s"] / mc
    out["total_over_memcpy"] = (out["publish_s"] + out["fetch_s"]) / mc
    out["memcpy_gbps"] = out["gb"] / mc
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (f"{'GB':>6} {'parts':>5} {'memcpy s':>9} {'publish s':>10} {'fetch s':>8} "
            f"{'GB/s memcpy/pub/fetch':>22} {'publish/mc':>10} {'fetch/mc':>9} "
            f"{'total/mc':>9} {'gloo/mc':>8} {'plasma GB':>9} {'RSS pub/fet GB':>15} "
            f"{'mem +GB':>7}")  # fmt: skip
    print(head)
    for r in rows:
        gloo = f"{r['coll_total_over_memcpy']:>7.1f}x" if "coll_total_s" in r else f"{'-':>8}"
        print(
            f"{r['gb']:>6.2f} {r['parts']:>5} {r['memcpy_s']:>9.3f} {r['publish_s']:>10.3f} "
            f"{r['fetch_s']:>8.3f} {r['memcpy_gbps']:>8.2f}/{r['publish_gbps']:.2f}/"
            f"{r['fetch_gbps']:.2f}{'':>2} {r['publish_over_memcpy']:>9.1f}x "
            f"{r['fetch_over_memcpy']:>8.1f}x {r['total_over_memcpy']:>8.1f}x {gloo} "
            f"{r['plasma_peak_gb']:>9.2f} {r['peak_rss_publisher_gb']:>7.2f}/"
            f"{r['peak_rss_fetcher_gb']:.2f}{'':>6} {r['machine_mem_growth_gb']:>7.2f}",
            flush=True,
        )


QUICK = {"gb": "0.02,0.1", "part_gb": 0.02, "repeats": 1, "collective": True}
"""CI size: a 20 MB state and a 100 MB-equivalent one (5 parts), gloo included: seconds."""


def run(gb: str, part_gb: float, repeats: int, collective: bool) -> list[dict[str, Any]]:
    """Every size, one at a time (buffers freed between sizes); needs a connected Ray."""
    rows = []
    for size in (float(x) for x in gb.split(",")):
        rows.append(measure(int(size * GB), int(part_gb * GB), repeats, collective))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", default="1.5,15", help="State sizes in GB (1e9 bytes).")
    p.add_argument("--part-gb", type=float, default=1.5,
                   help="Largest part put at once; larger states go as parts.")  # fmt: skip
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--collective", action="store_true", help="Also time a gloo broadcast.")
    p.add_argument("--quick", action="store_true", help="CI size: 0.02 and 0.1 GB, gloo too.")
    p.add_argument("--json", default=None, help="Also write the rows to this JSON file.")
    args = p.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)

    import ray

    from opdflow.raycluster import connect

    connect(2)
    rows = run(args.gb, args.part_gb, args.repeats, args.collective)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    main()
