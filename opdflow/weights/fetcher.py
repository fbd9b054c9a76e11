"""A consumer's side of a version's transport: from a WeightsRef to the weights in its model.

The handle's transport decides (transport.py): object_store gets the inner ref zero-copy
and the consumer's `load` copies the views into its model (loader.py); collective pairs the
consumer end with the learner at its first fetch and receives the version on that pair
in buckets (pair.py, bucket.py), in its own process (`LocalReceiver`: straight into the
model's parameters where they are laid out flat like the version) or in an engine's
workers (vLLM, through its worker extension: each tensor-parallel worker on its own
pair, loading its shard through vLLM's reload path).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Protocol

from opdflow.weights.bucket import IncomingVersion
from opdflow.weights.pair import PairEnd, node_ip, process_id
from opdflow.weights.version import TensorSpec, WeightsHandle, WeightsRef, views


class Receiver(Protocol):
    """Where a consumer's weights are received and loaded: in its own process (`LocalReceiver`)
    or in an engine's workers (VLLMEngine, through its worker extension)."""

    def pair_owners(self) -> list[str]:
        """One stable id per end that receives (a process; vLLM: each of its workers)."""
        ...

    def join(self, address: str, keys: list[str], backend: str, timeout_s: float) -> None:
        """Open each end's pair (`keys` in `pair_owners` order); blocks until joined."""
        ...

    def receive(
        self, version: int, specs: tuple[TensorSpec, ...], nbytes: int, bucket_bytes: int
    ) -> None:
        """Receive `version` on every end, in buckets, and load it into the model."""
        ...


class LocalReceiver:
    """Receives in this process and loads with `load(incoming, version)`: a model laid out
    flat like the version takes the buckets straight into its parameters
    (`loader.load_module`); any other reader gets the version whole first."""

    def __init__(self, load: Callable[[Any, int], None], device: Any):
        self.load = load
        self.device = device
        self.end: PairEnd | None = None

    def pair_owners(self) -> list[str]:
        return [process_id()]

    def join(self, address: str, keys: list[str], backend: str, timeout_s: float) -> None:
        self.end = PairEnd(address, keys[0], backend, self.device or "cpu", timeout_s, node_ip())

    def receive(
        self, version: int, specs: tuple[TensorSpec, ...], nbytes: int, bucket_bytes: int
    ) -> None:
        assert self.end is not None
        self.end.expect(version, nbytes, bucket_bytes)
        incoming = IncomingVersion(self.end, version, specs, nbytes, bucket_bytes)
        self.load(incoming, version)
        incoming.finish()


class Fetcher:
    """A consumer actor's side: resolves a handle and gets the version's bytes into its model."""

    def __init__(self) -> None:
        self._joined: tuple[str | None, int] | None = None  # (learner address, receiver id)
        self._keys: list[str] = []

    def fetch(
        self,
        handle: WeightsHandle,
        load: Callable[[Any, int], None],
        receiver: Receiver | None,
    ) -> None:
        """Load `handle`'s version as its transport says (transport.Transport.fetch)."""
        handle.transport.fetch(handle, load, receiver, self)

    def receive(self, handle: WeightsHandle, receiver: Receiver) -> None:
        """Receive a collective version on this consumer's pairs with the learner (opened
        at the first collective fetch): one send call for all of its ends."""
        import ray

        source = handle.source
        timeout_s = handle.transport.timeout_s
        if self._joined != (handle.address, id(receiver)):
            owners = receiver.pair_owners()
            keys = [f"{owner}/{uuid.uuid4().hex}" for owner in owners]
            opened = [source.open_pair.remote(k, o) for k, o in zip(keys, owners)]
            receiver.join(str(handle.address), keys, str(handle.backend), timeout_s)
            ray.get(opened)
            self._joined = (handle.address, id(receiver))
            self._keys = keys
        sent = source.send_weights.remote(handle.version, self._keys)
        try:
            receiver.receive(
                handle.version, handle.specs, handle.nbytes, handle.transport.bucket_bytes
            )
        except BaseException:
            ray.get(sent, timeout=timeout_s)  # the learner's reason, when it has one
            raise
        ray.get(sent)


def fetch_state(weights: WeightsRef) -> dict[str, Any]:
    """A published object-store version as zero-copy tensor views, from the driver or a test."""
    import ray

    handle = weights.handle()
    if handle.transport.needs_receiver:
        raise ValueError("fetch_state reads object-store versions; a collective one is received")
    return views(ray.get(handle.ref))
