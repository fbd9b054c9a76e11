"""How a weights version's bytes reach its consumers: the transport type and its two kinds.

`weights.transport` ("auto", "object_store" or "collective") is parsed once, by `parse`,
into a `Transport`; everything else asks that object what to do. Either way a version is
one ObjectRef the driver holds (its place in the version bound, inside a
`version.WeightsRef`) that resolves to a `version.WeightsHandle` once the version is
complete; its bytes are staged in the learner's host memory (memory.py), and the
learner's step loses only the FP32 -> BF16 cast into that staging, run beside its next
step (cast.py). A transport does four things:

- publish (the learner): `ObjectStore` has a learner thread `ray.put` the staging buffer
  while the next step trains (publisher.py); `Collective` keeps the staging buffer and
  puts only the handle.
- fetch into a model (a consumer): `ObjectStore` gets the buffer zero-copy and
  `loader.load_module` copies the views into the model; `Collective` receives it on the
  consumer's own 2-rank group with the learner (pair.py: NCCL between GPUs, gloo on CPUs)
  in buckets of `bucket_bytes` through two buffers (bucket.py), straight into the model's
  parameters (fetcher.py).
- release (the driver): the object store frees a version when its last ref goes; the
  collective also tells the learner which versions it must still hold.
- bytes live: what the live versions pin: their object-store copies, or the learner's
  held staging.

Why not Ray Direct Transport (ray 2.60, alpha): it works here once the receiving actor
also declares `enable_tensor_transport=True` (without it the transfer deadlocks and times
out after 60 s), but an actor may be in only one collective group per backend, its groups
are static (a restarted or added consumer means tearing the group down everywhere), its
torch_gloo group reuses the process's default process group (the data-parallel learner's
FSDP group) and its NCCL groups need cupy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from opdflow.weights.version import PackedWeights, WeightsHandle, WeightsRef, views

if TYPE_CHECKING:
    from opdflow.config import PipelineConfig, WeightsConfig
    from opdflow.weights.fetcher import Fetcher
    from opdflow.weights.publisher import Publisher
    from opdflow.weights.store import WeightStore

NAMES = ("object_store", "collective")
"""What `weights.transport` may resolve to ("auto" picks one of them)."""


@dataclass(frozen=True)
class Transport:
    """How versions move; a small value that travels inside every handle."""

    name: ClassVar[str]
    staging_buffers: ClassVar[int]
    """Staging buffers the learner alternates between (0: it holds the versions the driver
    still needs instead)."""
    needs_receiver: ClassVar[bool]
    """Whether a consumer receives the bytes itself (else it reads them from the store)."""

    def publish(self, publisher: Publisher, packed: PackedWeights, cast: Any, source: Any) -> Any:
        """The learner's side: hand a staged version (complete once `cast` is done) to the
        transport; the ObjectRef the version's WeightsRef carries (resolves to its handle)."""
        raise NotImplementedError

    def fetch(
        self,
        handle: WeightsHandle,
        load: Callable[[Any, int], None],
        receiver: Any,
        fetcher: Fetcher,
    ) -> None:
        """A consumer's side: get `handle`'s version into its model (`load(named, version)`
        or, collective, through `receiver`)."""
        raise NotImplementedError

    def release(self, learner: Any, needed: list[int], seq: int) -> dict[str, Any] | None:
        """The driver's side, after it dropped older versions: what the learner holds now
        (collective), or None."""
        return None

    def bytes_live(self, store: WeightStore, held: dict[str, Any] | None) -> int:
        """Bytes the live versions pin (`held`: the last `release`'s answer)."""
        return store.bytes_live()

    def describe(self, backend: str) -> str:
        """How a consumer's fetches go, for the run's events ("collective/gloo")."""
        return self.name


@dataclass(frozen=True)
class ObjectStore(Transport):
    """Versions as objects in Ray's object store: put once by the learner, read zero-copy."""

    name: ClassVar[str] = "object_store"
    staging_buffers: ClassVar[int] = 2
    needs_receiver: ClassVar[bool] = False

    def publish(self, publisher: Publisher, packed: PackedWeights, cast: Any, source: Any) -> Any:
        publisher.stage(packed, cast)
        return source.seal.remote(packed.version)  # the put runs in a weights thread, once cast

    def fetch(
        self,
        handle: WeightsHandle,
        load: Callable[[Any, int], None],
        receiver: Any,
        fetcher: Fetcher,
    ) -> None:
        import ray

        load(views(ray.get(handle.ref)), handle.version)


@dataclass(frozen=True)
class Collective(Transport):
    """Versions held in the learner's host staging, received by each consumer end on its
    own pair with the learner, in buckets."""

    name: ClassVar[str] = "collective"
    staging_buffers: ClassVar[int] = 0
    needs_receiver: ClassVar[bool] = True
    bucket_bytes: int = 256 * 2**20
    """Bytes per bucket (weights.bucket_mb)."""
    timeout_s: float = 300.0
    """A pair setup or one version's receive that takes longer fails (weights.timeout_s)."""

    def publish(self, publisher: Publisher, packed: PackedWeights, cast: Any, source: Any) -> Any:
        import ray

        return ray.put(publisher.hold(packed, source, cast))  # the handle only: bytes stay

    def fetch(
        self,
        handle: WeightsHandle,
        load: Callable[[Any, int], None],
        receiver: Any,
        fetcher: Fetcher,
    ) -> None:
        if receiver is None:
            raise RuntimeError("a collective weights version needs a receiver in the consumer")
        fetcher.receive(handle, receiver)

    def release(self, learner: Any, needed: list[int], seq: int) -> dict[str, Any] | None:
        import ray

        return ray.get(learner.retain.remote(needed, seq))  # a learner thread: ~1 ms

    def bytes_live(self, store: WeightStore, held: dict[str, Any] | None) -> int:
        return store.bytes_live() if held is None else int(held["bytes"])

    def describe(self, backend: str) -> str:
        return f"{self.name}/{backend}"


def parse(
    weights: WeightsConfig, learner_gpus: float = 0.0, consumer_gpus: Iterable[float] = ()
) -> Transport:
    """The transport a run uses: "auto" is collective when the learner and every consumer
    have a GPU (NCCL needs both ends on one), else the object store."""
    name = weights.transport
    if name == "auto":
        on_gpus = learner_gpus > 0 and all(g > 0 for g in consumer_gpus)
        name = "collective" if on_gpus else "object_store"
    if name == "object_store":
        return ObjectStore()
    if name == "collective":
        return Collective(bucket_bytes=int(weights.bucket_mb) * 2**20, timeout_s=weights.timeout_s)
    raise ValueError(f"weights.transport = {name!r}: expected auto or one of {NAMES}")


def for_pipeline(cfg: PipelineConfig) -> Transport:
    """The transport a pipeline's weights.* parses into for its resources ("auto" resolved
    by whether the learner and every consumer (generator, rescorer, evaluator) has a GPU)."""
    r = cfg.resources
    consumers = (r.generator.num_gpus, r.rescorer.num_gpus, r.evaluator.num_gpus)
    return parse(cfg.weights, r.learner.num_gpus, consumers)


def put_version(packed: PackedWeights) -> WeightsRef:
    """Publish a packed version through the object store from a driver or a test, as the
    learner does: the WeightsRef consumers take."""
    import ray

    handle = WeightsHandle(packed.version, ObjectStore(), packed.specs, packed.nbytes,
                           ref=ray.put(packed))  # fmt: skip
    return WeightsRef(packed.version, ray.put(handle), packed.nbytes)
