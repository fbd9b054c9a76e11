"""Weight broadcast through Ray's object store next to a plain memcpy of the same bytes.

    PYTHONPATH=. python bench/weight_broadcast.py [--mb 50,200,500] [--repeats 5]

A bf16 state dict of the given size (tensors of 4M elements, like a model's layers) goes
the way the learner ships weights: publish = opdflow.weights.pack + ray.put in one actor;
fetch = ray.get + unpack in another actor (what a generator does). Reference: one
single-thread np.copyto of the same number of bytes. Medians of --repeats; ratios are
seconds divided by memcpy seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def make_state(mb: int) -> dict:
    import torch

    n = mb * 2**20 // 2  # bf16 elements
    chunk = 4 * 2**20
    state, i = {}, 0
    while n > 0:
        m = min(chunk, n)
        state[f"layer{i}.weight"] = torch.randn(m, dtype=torch.float32).to(torch.bfloat16)
        n -= m
        i += 1
    return state


class Publisher:
    def __init__(self, mb: int):
        import torch

        torch.set_num_threads(1)
        self.state = make_state(mb)

    def publish(self) -> list:
        import ray

        from opdflow.weights import pack

        t0 = time.perf_counter()
        packed = pack(self.state, 1)
        t1 = time.perf_counter()
        ref = ray.put(packed)
        t2 = time.perf_counter()
        return [ref, t1 - t0, t2 - t1, packed.nbytes]


class Fetcher:
    def __init__(self):
        import torch

        torch.set_num_threads(1)

    def fetch(self, box: list) -> tuple[float, float]:
        import ray

        from opdflow.weights import unpack

        t0 = time.perf_counter()
        packed = ray.get(box[0])
        t1 = time.perf_counter()
        state = unpack(packed)
        t2 = time.perf_counter()
        assert state
        return t1 - t0, t2 - t1


def memcpy_s(nbytes: int, repeats: int) -> float:
    src = np.random.randint(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", default="50,200,500")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    import ray

    from opdflow.raycluster import connect

    connect(2)
    print(
        f"{'MB':>5} {'memcpy ms':>10} {'pack ms':>8} {'put ms':>8} {'get ms':>8} "
        f"{'unpack ms':>10} {'publish/memcpy':>15} {'fetch/memcpy':>13} {'total/memcpy':>13}"
    )
    for mb in (int(x) for x in args.mb.split(",")):
        pub = ray.remote(Publisher).options(num_cpus=0).remote(mb)
        fet = ray.remote(Fetcher).options(num_cpus=0).remote()
        rows = []
        for _ in range(args.repeats + 1):  # the first is a warm-up
            ref, pack_s, put_s, nbytes = ray.get(pub.publish.remote())
            get_s, unpack_s = ray.get(fet.fetch.remote([ref]))
            rows.append((pack_s, put_s, get_s, unpack_s))
            del ref
        med = [statistics.median(r[i] for r in rows[1:]) for i in range(4)]
        mc = memcpy_s(nbytes, args.repeats)
        publish, fetch = med[0] + med[1], med[2] + med[3]
        print(
            f"{nbytes / 2**20:>5.0f} {mc * 1e3:>10.1f} {med[0] * 1e3:>8.1f} {med[1] * 1e3:>8.1f} "
            f"{med[2] * 1e3:>8.2f} {med[3] * 1e3:>10.1f} {publish / mc:>14.1f}x "
            f"{fetch / mc:>12.1f}x {(publish + fetch) / mc:>12.1f}x",
            flush=True,
        )
        ray.kill(pub)
        ray.kill(fet)
    ray.shutdown()


if __name__ == "__main__":
    main()
