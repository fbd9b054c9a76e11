"""A consumer's side of a version's transport: from a WeightsRef to the weights in its model.

object_store: the handle's inner ref is got zero-copy and `weights.load_module` (through the
consumer's `load`) copies the views into its model. collective: the consumer end pairs with
the learner at its first collective fetch and receives the version on that pair
(pairs.py), in its own process (`LocalReceiver`) or in an engine's workers (vLLM, through
its worker extension).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Protocol

from opdflow.weights.pair import PairEnd, node_ip, process_id
from opdflow.weights.version import TensorSpec, WeightsHandle, WeightsRef, views


class Receiver(Protocol):
    """Where a consumer's weights are received and loaded: in its own process (`LocalReceiver`)
    or in an engine's workers (VLLMEngine, through its worker extension)."""

    piece_bytes: int
    """Pieces it receives a version in (`plan_pieces`; 0: whole, into one buffer)."""

    def pair_owners(self) -> list[str]:
        """One stable id per end that receives (a process; vLLM: each of its workers)."""
        ...

    def join(self, address: str, keys: list[str], backend: str, timeout_s: float) -> None:
        """Open each end's pair (`keys` in `pair_owners` order); blocks until joined."""
        ...

    def receive(self, version: int, specs: tuple[TensorSpec, ...], nbytes: int) -> None:
        """Receive `version` on every end and load it into the model."""
        ...


class LocalReceiver:
    """Receives in this process, whole, and loads with `load(views, version)`."""

    piece_bytes = 0

    def __init__(self, load: Callable[[dict[str, Any], int], None], device: Any):
        self.load = load
        self.device = device
        self.end: PairEnd | None = None

    def pair_owners(self) -> list[str]:
        return [process_id()]

    def join(self, address: str, keys: list[str], backend: str, timeout_s: float) -> None:
        self.end = PairEnd(address, keys[0], backend, self.device, timeout_s, node_ip())

    def receive(self, version: int, specs: tuple[TensorSpec, ...], nbytes: int) -> None:
        assert self.end is not None
        self.load(views(self.end.receive(version, specs, nbytes)), version)


class Fetcher:
    """A consumer actor's side: resolves a handle and gets the version's bytes into its model."""

    def __init__(self) -> None:
        self._joined: tuple[str | None, int] | None = None  # (learner address, receiver id)
        self._keys: list[str] = []

    def fetch(
        self,
        handle: WeightsHandle,
        load: Callable[[dict[str, Any], int], None],
        receiver: Receiver | None,
    ) -> None:
        """Load `handle`'s version: zero-copy views of the object-store buffer, or a receive
        on this consumer's pair with the learner (opened at the first collective fetch)."""
        import ray

        if handle.transport == "object_store":
            load(views(ray.get(handle.ref)), handle.version)
            return
        if receiver is None:
            raise RuntimeError("a collective weights version needs a receiver in the consumer")
        source = handle.source
        if self._joined != (handle.address, id(receiver)):
            owners = receiver.pair_owners()
            keys = [f"{owner}/{uuid.uuid4().hex}" for owner in owners]
            opened = [source.open_pair.remote(k, o) for k, o in zip(keys, owners)]
            receiver.join(str(handle.address), keys, str(handle.backend), handle.timeout_s)
            ray.get(opened)
            self._joined = (handle.address, id(receiver))
            self._keys = keys
        piece = receiver.piece_bytes
        sent = [source.send_weights.remote(handle.version, k, piece) for k in self._keys]
        try:
            receiver.receive(handle.version, handle.specs, handle.nbytes)
        except BaseException:
            ray.get(sent, timeout=handle.timeout_s)  # the learner's reason, when it has one
            raise
        ray.get(sent)


def fetch_state(weights: WeightsRef) -> dict[str, Any]:
    """A published object-store version as zero-copy tensor views, from the driver or a test."""
    import ray

    handle = weights.handle()
    if handle.transport != "object_store":
        raise ValueError("fetch_state reads object-store versions; a collective one is received")
    return views(ray.get(handle.ref))
