"""The run's own weight path, per transport, next to a memcpy of the same bytes.

    PYTHONPATH=. python bench/weight_broadcast.py [--gb 1.5] [--repeats 3] [--threads 1]
                                                  [--transport both] [--out FILE]
    PYTHONPATH=. python bench/weight_broadcast.py --quick      # CI size: seconds

A learner actor (LearnerActor with an FP32 state of 4M-element tensors in place of a model:
`LearnerActor._publish` unchanged) publishes a version; a generator-like actor (a
StageActor with a BF16 module of the same tensors) fetches and loads it with
`StageActor.ensure_weights`, as GeneratorWorker does. For each transport:

- publish_critical: what the learner's step waits for (the FP32 -> BF16 cast into its
  reused buffer, and handing it to the transport), timed inside the actor;
- put (object_store only): the ray.put that follows in a learner thread, off the critical
  path (timed in that thread);
- fetch_load: the consumer's fetch span, from the ref to the weights in its module
  (object_store: zero-copy get + one copy into the parameters; collective: receive on its
  gloo/NCCL pair with the learner + one copy);
- next_step_slowdown: a fixed CPU workload the learner runs right after publishing (the
  next step), with the put running beside it, over the same workload alone.

memcpy: single-thread np.copyto of the state's BF16 bytes in the driver, run right before
each timed publish and each fetch; a ratio is a repeat's seconds over its adjacent memcpy,
and the reported ratio is the median over --repeats (after one warm-up; the first fetch
also opens the collective's pair). The consumer's weights are checked byte for byte
against the learner's BF16 cast. Default size: 1.5 GB, 15 GB where CUDA is visible.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

GB = 1e9
TENSOR_ELEMENTS = 4 * 2**20
TRANSPORTS = ("object_store", "collective")


def make_shapes(nbytes_bf16: int) -> list[tuple[str, int]]:
    """(name, elements) of a state whose BF16 form is `nbytes_bf16` bytes: 4M-element tensors."""
    n, out, i = nbytes_bf16 // 2, [], 0
    while n > 0:
        m = min(TENSOR_ELEMENTS, n)
        out.append((f"layer{i}.weight", m))
        n -= m
        i += 1
    return out


def _module(shapes: list[tuple[str, int]], dtype: Any, seed: int) -> Any:
    """A module holding one parameter per (name, elements): random values cloned from one
    tensor (content does not change copy speed; cloning is faster than sampling)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    base = torch.randn(max(m for _, m in shapes), generator=g).to(dtype)
    module = torch.nn.Module()
    for name, m in shapes:
        module.register_parameter(
            name.replace(".", "_"), torch.nn.Parameter(base[:m].clone(), requires_grad=False)
        )
    return module


class StateLearner:
    """Stands in for stages/learner.py's Learner in the bench: an FP32 state and the same
    cast (weights.write_bf16) into the publisher's buffer."""

    def __init__(self, shapes: list[tuple[str, int]]):
        import torch

        self.model = _module(shapes, torch.float32, seed=0)
        self.version = 0
        self.device = torch.device("cpu")

    def bf16_entries(self) -> list:
        from opdflow.runtime.weights import bf16_entries

        return bf16_entries(self.model.state_dict())

    def write_bf16(self, packed: Any) -> None:
        from opdflow.runtime.weights import write_bf16

        write_bf16(self.model.state_dict(), packed)


def learner_actor_class() -> type:
    """LearnerActor whose Learner is a StateLearner; its _publish and weights methods run as
    in a pipeline."""
    from opdflow.runtime.transport import Publisher
    from opdflow.stages import pin_threads
    from opdflow.stages.learner_actor import LearnerActor

    class BenchLearner(LearnerActor):
        def __init__(self, shapes: list[tuple[str, int]], transport: str, threads: int = 1):
            pin_threads(threads)
            self.rank, self.peers = 0, []
            self.learner = StateLearner(shapes)
            self.publisher = Publisher(transport, self.learner.device)

        def publish_next(self) -> list:
            """Publish the next version (as after a step): [ref, bytes, critical seconds]."""
            self.learner.version += 1
            return self._publish()

        def work(self, n: int) -> float:
            """Seconds of a fixed CPU workload (a stand-in for the next step's compute)."""
            import torch

            a = torch.ones(384, 384)
            t0 = time.perf_counter()
            for _ in range(n):
                a = (a @ a).clamp_(-1, 1)
            return time.perf_counter() - t0

        def put_s(self) -> float:
            return self.publisher.last_put_s

        def bf16_digest(self) -> str:
            return digest(self.learner.model)

    return BenchLearner


def consumer_actor_class() -> type:
    """A generator's weight path without an engine: ensure_weights into a BF16 module."""
    from opdflow.stages import StageActor, pin_threads

    class Consumer(StageActor):
        def __init__(self, shapes: list[tuple[str, int]], threads: int = 1):
            import torch

            pin_threads(threads)
            self.model = _module(shapes, torch.bfloat16, seed=1)
            self.version = 0

        def load_weights(self, state: dict, version: int) -> None:
            from opdflow.runtime.weights import load_module

            load_module(self.model, state)
            self.version = version

        def fetch(self, version: int, box: list) -> float:
            """Seconds of the fetch span that brought `version` into the module."""
            self.ensure_weights(version, self.version, box, -1, self.load_weights, "cpu")
            return next(s[4] for s in reversed(self.drain_spans()) if s[0] == "fetch")

        def digest(self) -> str:
            return digest(self.model)

    return Consumer


def digest(module: Any) -> str:
    """sha256 of a module's tensors in BF16 (its published bytes), in state-dict order."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for t in module.state_dict().values():
        h.update(t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()


class Memcpy:
    """Single-thread np.copyto of `nbytes` between two buffers faulted in once."""

    def __init__(self, nbytes: int):
        self.src = np.empty(nbytes, dtype=np.uint8)
        self.src.fill(7)
        self.dst = np.empty_like(self.src)
        np.copyto(self.dst, self.src)

    def __call__(self) -> float:
        t0 = time.perf_counter()
        np.copyto(self.dst, self.src)
        return time.perf_counter() - t0


def measure(
    transport: str, shapes: list, memcpy: Memcpy, repeats: int, work_n: int, threads: int = 1
) -> dict:
    """One transport: per-repeat seconds and ratios, medians; needs a connected Ray."""
    import ray

    from opdflow.stages.learner_actor import CONCURRENCY_GROUPS

    opts = {"num_cpus": 0}
    learner = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(learner_actor_class())
    learner = learner.options(**opts).remote(shapes, transport, threads)
    consumer = ray.remote(consumer_actor_class()).options(**opts).remote(shapes)
    rows = []
    alone = [ray.get(learner.work.remote(work_n)) for _ in range(2)][-1]
    for i in range(repeats + 1):  # the first is a warm-up (buffers, pair, page tables)
        mc_pub = memcpy()
        ref, nbytes, critical = ray.get(learner.publish_next.remote())
        with_put = ray.get(learner.work.remote(work_n))  # the next step, beside the put
        t0 = time.perf_counter()
        ray.wait([ref], fetch_local=False)  # the handle exists once the version is complete
        ready_s = time.perf_counter() - t0
        put_s = ray.get(learner.put_s.remote()) if transport == "object_store" else 0.0
        mc_fetch = memcpy()
        fetch = ray.get(consumer.fetch.remote(i + 1, [ref]))
        if transport == "collective":
            ray.get(learner.retain.remote([i + 1]))
        del ref
        rows.append({
            "memcpy_publish_s": mc_pub, "publish_critical_s": critical, "put_s": put_s,
            "ready_wait_s": ready_s,
            "memcpy_fetch_s": mc_fetch, "fetch_load_s": fetch, "next_step_s": with_put,
        })  # fmt: skip
    same = ray.get(consumer.digest.remote()) == ray.get(learner.bf16_digest.remote())
    ray.kill(learner)
    ray.kill(consumer)
    timed = rows[1:]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in timed)

    def med_ratio(num: str, den: str) -> float:
        return statistics.median(r[num] / r[den] for r in timed)

    return {
        "transport": transport,
        "gb": nbytes / GB,
        "learner_threads": threads,
        "repeats": repeats,
        "memcpy_s": statistics.median(
            [r["memcpy_publish_s"] for r in timed] + [r["memcpy_fetch_s"] for r in timed]
        ),
        "publish_critical_s": med("publish_critical_s"),
        "put_s": med("put_s"),
        "fetch_load_s": med("fetch_load_s"),
        "publish_critical_over_memcpy": med_ratio("publish_critical_s", "memcpy_publish_s"),
        "fetch_load_over_memcpy": med_ratio("fetch_load_s", "memcpy_fetch_s"),
        "publish_fetch_over_memcpy": statistics.median(
            (r["publish_critical_s"] + r["fetch_load_s"])
            / (r["memcpy_publish_s"] + r["memcpy_fetch_s"])
            * 2
            for r in timed
        ),
        "next_step_slowdown": med("next_step_s") / alone,
        "bytes_equal": same,
        "rows": rows,
    }


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'transport':>13} {'GB':>5} {'memcpy s':>9} {'publish s':>10} {'put s':>7} "
          f"{'fetch s':>8} {'publish/mc':>10} {'fetch/mc':>9} {'pub+fetch/mc':>12} "
          f"{'next step':>9} {'same bytes':>10}")  # fmt: skip
    for r in results:
        print(
            f"{r['transport']:>13} {r['gb']:>5.2f} {r['memcpy_s']:>9.3f} "
            f"{r['publish_critical_s']:>10.3f} {r['put_s']:>7.3f} {r['fetch_load_s']:>8.3f} "
            f"{r['publish_critical_over_memcpy']:>9.2f}x {r['fetch_load_over_memcpy']:>8.2f}x "
            f"{r['publish_fetch_over_memcpy']:>11.2f}x {r['next_step_slowdown']:>8.2f}x "
            f"{r['bytes_equal']!s:>10}",
            flush=True,
        )


QUICK = {"gb": 0.02, "repeats": 1, "work_n": 20}
"""CI size: a 20 MB state, one timed repeat, both transports: seconds."""


def run(
    gb: float,
    repeats: int,
    work_n: int = 200,
    transports: tuple = TRANSPORTS,
    threads: int = 1,
) -> list:
    """Every transport, one after the other (actors killed between); needs a connected Ray."""
    shapes = make_shapes(int(gb * GB))
    memcpy = Memcpy(sum(m for _, m in shapes) * 2)
    return [measure(t, shapes, memcpy, repeats, work_n, threads) for t in transports]


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """What --out writes: per transport, the medians (rows per repeat included)."""
    return {r["transport"]: {k: v for k, v in r.items() if k != "transport"} for r in results}


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_gb = 15.0 if torch.cuda.is_available() else 1.5
    p.add_argument("--gb", type=float, default=default_gb, help="BF16 state size in GB.")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--transport", choices=[*TRANSPORTS, "both"], default="both")
    p.add_argument("--threads", type=int, default=1,
                   help="The learner's torch threads (resources.learner.torch_threads).")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="CI size: 0.02 GB, one repeat.")
    p.add_argument("--out", default=None, help="Write the medians per transport as JSON here.")
    args = p.parse_args()
    work_n = 200
    if args.quick:
        args.gb, args.repeats, work_n = QUICK["gb"], QUICK["repeats"], QUICK["work_n"]
    transports = TRANSPORTS if args.transport == "both" else (args.transport,)

    import ray

    from opdflow.runtime.cluster import connect

    connect(2)
    results = run(args.gb, args.repeats, work_n, transports, args.threads)
    print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary(results), f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    main()
