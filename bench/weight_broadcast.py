"""The run's own weight path, per transport, next to a memcpy of the same bytes.

    PYTHONPATH=. python bench/weight_broadcast.py [--gb 1.5] [--repeats 3] [--threads 1]
        [--transport both] [--bucket-mb 256] [--cast-in background|caller] [--out FILE]
    PYTHONPATH=. python bench/weight_broadcast.py --quick      # CI size: seconds

A learner actor (LearnerActor with an FP32 state of 4M-element tensors in place of a model:
`LearnerActor._publish` unchanged) trains and publishes; a generator-like actor (a
StageActor with a BF16 module of the same tensors) fetches and loads each version with
`StageActor.ensure_weights`, as GeneratorWorker does. The learner's step is the least any
step over such a state does: forward and backward each read every weight, a fixed CPU
workload stands for their compute, and the optimizer stand-in waits for the running cast
(as Learner does) and then updates every weight in place. Per transport and repeat:

- publish_critical: the seconds the publish call blocks the learner, plus how much longer
  the next step takes than a step with nothing being cast or put (measured right before);
- cast (in its thread) and put (object_store only, in a learner thread, once cast);
- fetch_load: the consumer's fetch span, from the ref to the weights in its module
  (object_store: zero-copy get + one copy; collective: buckets of --bucket-mb on the
  consumer's gloo/NCCL pair with the learner, straight into the module's parameters);
- with the collective, its bound (bench/gloo_bound.py): one bare gloo message of the
  same bytes between two actors, next to its own memcpy (the `bound:` line).

`--cast-in caller` casts inside the publish call (a sharded learner's path). memcpy:
single-thread np.copyto of the state's BF16 bytes, right before each timed publish and
fetch; a ratio is a repeat's seconds over its adjacent memcpy, reported as the median over
--repeats (after one warm-up, which also opens the collective's pair). The weights the
consumer loaded last are checked byte for byte against a plain BF16 cast of the learner's
weights. Default size: 1.5 GB, 15 GB where CUDA is visible.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path
from typing import Any


def _sibling(name: str) -> Any:
    """A bench script beside this one, loaded by path (the benches are scripts, no package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gloo_bound = _sibling("gloo_bound")
Memcpy = gloo_bound.Memcpy
GB = 1e9
TENSOR_ELEMENTS = 4 * 2**20
TRANSPORTS = ("object_store", "collective")
CAST_IN = ("background", "caller")


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
    """Stands in for stages/learner.py's Learner in the bench: an FP32 state, the same cast
    (cast.BF16Cast: beside the next step, as on a one-worker CPU learner, or in the caller
    with `cast_in="caller"`) and a minimal step over the state: a forward and backward
    stand-in (each reads every weight once, then a fixed CPU workload), then the optimizer
    stand-in, which settles the cast first (as Learner does before its optimizer step) and
    updates every weight in place."""

    def __init__(self, shapes: list[tuple[str, int]], cast_in: str = "background"):
        import torch

        from opdflow.weights.cast import BF16Cast

        self.model = _module(shapes, torch.float32, seed=0)
        self.version = 0
        self.device = torch.device("cpu")
        self.cast = BF16Cast(background=cast_in == "background")

    def bf16_entries(self) -> list:
        from opdflow.weights.cast import bf16_entries

        return bf16_entries(self.model.state_dict())

    def cast_bf16(self, packed: Any) -> Any:
        return self.cast.start(self.model.state_dict(), packed)

    def train_step(self, work_n: int) -> float:
        """Seconds of one step: forward and backward read every weight, `work_n` rounds of
        a fixed matmul stand for their compute, then the update (after the cast settles)."""
        import torch

        weights = list(self.model.parameters())
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in ("forward", "backward"):
                for w in weights:
                    w.sum()
            work(work_n)
            self.cast.settle()
            for w in weights:
                w.mul_(1 - 2**-9)
        return time.perf_counter() - t0


def work(n: int) -> float:
    """Seconds of a fixed CPU workload (a stand-in for a step's compute)."""
    import torch

    a = torch.ones(384, 384)
    t0 = time.perf_counter()
    for _ in range(n):
        a = (a @ a).clamp_(-1, 1)
    return time.perf_counter() - t0


def learner_actor_class() -> type:
    """LearnerActor whose Learner is a StateLearner; its _publish and weights methods run as
    in a pipeline."""
    from opdflow.config import WeightsConfig
    from opdflow.stages.actor import pin_threads
    from opdflow.stages.learner_actor import LearnerActor
    from opdflow.weights.publisher import Publisher
    from opdflow.weights.transport import parse

    class BenchLearner(LearnerActor):
        def __init__(
            self, shapes: list[tuple[str, int]], transport: str, threads: int, cast_in: str,
            bucket_mb: int = 256,
        ):  # fmt: skip
            pin_threads(threads)
            self.rank, self.peers, self.timeline = 0, [], 0
            self.learner = StateLearner(shapes, cast_in)
            weights = WeightsConfig(transport=transport, bucket_mb=bucket_mb)
            self.publisher = Publisher(parse(weights), self.learner.device)

        def publish_next(self) -> tuple[Any, float]:
            """Publish the next version (as after a step): its WeightsRef and the seconds
            the publish call blocked the actor."""
            self.learner.version += 1
            return self._publish()

        def step(self, work_n: int) -> float:
            return self.learner.train_step(work_n)

        def seconds(self) -> dict[str, float]:
            """The latest put's and cast's seconds (each in its own thread)."""
            return {"put_s": self.publisher.last_put_s, "cast_s": self.learner.cast.last_cast_s}

        def bf16_digest(self) -> str:
            return digest(self.learner.model)

    return BenchLearner


def consumer_actor_class() -> type:
    """A generator's weight path without an engine: ensure_weights into a BF16 module."""
    from opdflow.stages.actor import StageActor, pin_threads

    class Consumer(StageActor):
        def __init__(self, shapes: list[tuple[str, int]], threads: int = 1):
            import torch

            pin_threads(threads)
            self.model = _module(shapes, torch.bfloat16, seed=1)
            self.version = 0

        def load_weights(self, state: dict, version: int) -> None:
            from opdflow.weights.loader import load_module

            load_module(self.model, state)
            self.version = version

        def fetch(self, weights: Any) -> float:
            """Seconds of the fetch span that brought `weights` into the module."""
            self.ensure_weights(weights, self.version, -1, self.load_weights, "cpu")
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


def measure(
    transport: str,
    shapes: list,
    memcpy: Memcpy,
    repeats: int,
    work_n: int,
    threads: int = 1,
    cast_in: str = "background",
    bucket_mb: int = 256,
) -> dict:
    """One transport: per-repeat seconds and ratios, medians; needs a connected Ray."""
    import ray

    from opdflow.stages.learner_actor import learner_class

    opts = {"num_cpus": 0}
    learner = learner_class(learner_actor_class())
    learner = learner.options(**opts).remote(shapes, transport, threads, cast_in, bucket_mb)
    consumer = ray.remote(consumer_actor_class()).options(**opts).remote(shapes)
    rows = []
    ray.get(learner.step.remote(work_n))  # pages and caches warm
    for i in range(repeats + 1):  # the first is a warm-up (buffers, pair, page tables)
        mc_pub = memcpy()
        step_alone = ray.get(learner.step.remote(work_n))  # nothing being cast or put
        if i == repeats:  # a plain cast of the weights the last version is published from
            expected = ray.get(learner.bf16_digest.remote())
        weights, blocked = ray.get(learner.publish_next.remote())
        step_after = ray.get(learner.step.remote(work_n))  # the cast (and put) beside it
        t0 = time.perf_counter()
        ray.wait([weights.ref], fetch_local=False)  # the handle exists once complete
        ready_s = time.perf_counter() - t0
        seconds = ray.get(learner.seconds.remote())
        mc_fetch = memcpy()
        fetch = ray.get(consumer.fetch.remote(weights))
        if transport == "collective":
            ray.get(learner.retain.remote([weights.version]))
        del weights
        rows.append({
            "memcpy_publish_s": mc_pub, "publish_blocked_s": blocked,
            "step_alone_s": step_alone, "step_after_publish_s": step_after,
            "publish_critical_s": blocked + step_after - step_alone,
            "cast_s": seconds["cast_s"],
            "put_s": seconds["put_s"] if transport == "object_store" else 0.0,
            "ready_wait_s": ready_s, "memcpy_fetch_s": mc_fetch, "fetch_load_s": fetch,
        })  # fmt: skip
    same = ray.get(consumer.digest.remote()) == expected
    ray.kill(learner)
    ray.kill(consumer)
    timed = rows[1:]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in timed)

    def med_ratio(num: str, den: str) -> float:
        return statistics.median(r[num] / r[den] for r in timed)

    return {
        "transport": transport,
        "cast_in": cast_in,
        "bucket_mb": bucket_mb if transport == "collective" else None,
        "gb": sum(m for _, m in shapes) * 2 / GB,
        "learner_threads": threads,
        "repeats": repeats,
        "memcpy_s": statistics.median(
            [r["memcpy_publish_s"] for r in timed] + [r["memcpy_fetch_s"] for r in timed]
        ),
        "step_alone_s": med("step_alone_s"),
        "publish_critical_s": med("publish_critical_s"),
        "cast_s": med("cast_s"),
        "put_s": med("put_s"),
        "fetch_load_s": med("fetch_load_s"),
        "publish_critical_over_memcpy": med_ratio("publish_critical_s", "memcpy_publish_s"),
        "cast_over_memcpy": med_ratio("cast_s", "memcpy_publish_s"),
        "fetch_load_over_memcpy": med_ratio("fetch_load_s", "memcpy_fetch_s"),
        "publish_fetch_over_memcpy": statistics.median(
            (r["publish_critical_s"] + r["fetch_load_s"])
            / (r["memcpy_publish_s"] + r["memcpy_fetch_s"])
            * 2
            for r in timed
        ),
        "bytes_equal": same,
        "rows": rows,
    }


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'transport':>13} {'cast in':>10} {'GB':>5} {'memcpy s':>9} {'step s':>7} "
          f"{'cast s':>7} {'put s':>6} {'publish s':>10} {'fetch s':>8} {'cast/mc':>8} "
          f"{'publish/mc':>10} {'fetch/mc':>9} {'pub+fetch/mc':>12} {'same bytes':>10}")  # fmt: skip
    for r in results:
        print(
            f"{r['transport']:>13} {r['cast_in']:>10} {r['gb']:>5.2f} {r['memcpy_s']:>9.3f} "
            f"{r['step_alone_s']:>7.3f} {r['cast_s']:>7.3f} {r['put_s']:>6.3f} "
            f"{r['publish_critical_s']:>10.3f} {r['fetch_load_s']:>8.3f} "
            f"{r['cast_over_memcpy']:>7.2f}x {r['publish_critical_over_memcpy']:>9.2f}x "
            f"{r['fetch_load_over_memcpy']:>8.2f}x {r['publish_fetch_over_memcpy']:>11.2f}x "
            f"{r['bytes_equal']!s:>10}",
            flush=True,
        )


QUICK = {"gb": 0.02, "repeats": 1, "work_n": 20, "bucket_mb": 4}
"""CI size: a 20 MB state (5 buckets of 4 MiB), one timed repeat, both transports: seconds."""


def run(
    gb: float,
    repeats: int,
    work_n: int = 200,
    transports: tuple = TRANSPORTS,
    threads: int = 1,
    cast_in: str = "background",
    bucket_mb: int = 256,
) -> list:
    """Every transport, one after the other (actors killed between); needs a connected Ray."""
    shapes = make_shapes(int(gb * GB))
    memcpy = Memcpy(sum(m for _, m in shapes) * 2)
    return [
        measure(t, shapes, memcpy, repeats, work_n, threads, cast_in, bucket_mb) for t in transports
    ]


def wire(gb: float, repeats: int) -> dict[str, Any]:
    """The collective's bound (bench/gloo_bound.py) for a state of `gb`, next to the same
    memcpy; needs a connected Ray."""
    nbytes = 2 * sum(m for _, m in make_shapes(int(gb * GB)))
    return gloo_bound.measure(nbytes, repeats, Memcpy(nbytes))


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
    p.add_argument("--bucket-mb", type=int, default=256,
                   help="The collective's bucket size (weights.bucket_mb).")  # fmt: skip
    p.add_argument("--threads", type=int, default=1,
                   help="The learner's torch threads (resources.learner.torch_threads).")  # fmt: skip
    p.add_argument("--cast-in", choices=CAST_IN, default="background",
                   help="Where the learner casts: beside the next step (a one-worker CPU "
                   "learner) or in the publish call (a sharded learner; before the overlap).")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="CI size: 0.02 GB, one repeat.")
    p.add_argument("--out", default=None, help="Write the medians per transport as JSON here.")
    args = p.parse_args()
    work_n = 200
    if args.quick:
        args.gb, args.repeats, work_n = QUICK["gb"], QUICK["repeats"], QUICK["work_n"]
        args.bucket_mb = QUICK["bucket_mb"]
    transports = TRANSPORTS if args.transport == "both" else (args.transport,)

    import ray

    from opdflow.cluster.connection import connect

    connect(2)
    results = run(
        args.gb, args.repeats, work_n, transports, args.threads, args.cast_in, args.bucket_mb
    )
    print_table(results)
    out = summary(results)
    if "collective" in transports:
        out["wire"] = wire(args.gb, args.repeats)
        gloo_bound.print_bound(out["wire"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    main()
