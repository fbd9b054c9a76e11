"""What every stage actor shares: its torch threads, its spans, and the weights it fetches.

A stage's logic is a plain class beside its actor; the actor subclasses `StageActor`,
which adds what only a Ray actor needs: its pid (fault tests), its placement group, the
profiler's span recorder, and `ensure_weights`, which gets a published version into the
stage's model by the version's transport.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opdflow.record.profiler import SpanRecorder

if TYPE_CHECKING:
    from opdflow.weights.version import WeightsRef


def pin_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(1)


class StageActor(SpanRecorder):
    """Mixin of every stage actor."""

    def pid(self) -> int:
        """The actor's process id (fault-injection tests kill it)."""
        return os.getpid()

    def placement_group_id(self) -> str | None:
        """Hex id of the placement group the actor runs in (None outside any)."""
        import ray

        return ray.get_runtime_context().get_placement_group_id()

    def ensure_weights(
        self,
        weights: WeightsRef,
        current: int,
        step: int,
        load: Callable[[dict, int], None],
        device: Any = None,
        receiver: Any = None,
    ) -> None:
        """Unless `current` is already `weights.version` of the same timeline, get that
        version into the model, timed as a "fetch" span: nothing is fetched when the version
        is current (the ref inside a WeightsRef reaches the actor unresolved). The ref
        resolves to the version's handle once the version is complete; then `load(views,
        version)` copies zero-copy views of the object-store buffer into the model, or
        (collective) the version is received on this actor's pair with the learner, in
        buckets on `device`, by `receiver` (default: here, straight into the model through
        `load`). A new timeline (the
        learner healed) is a new learner: its versions are fetched even where the number is
        the same, and collective pairs are opened again with its rank 0."""
        timeline = self.__dict__.get("_timeline", 0)
        if weights.version == current and weights.timeline == timeline:
            return
        from opdflow.weights.fetcher import Fetcher, LocalReceiver

        if weights.timeline != timeline:
            self.__dict__.pop("_fetcher", None)  # its pair was with the old rank 0
        fetcher = self.__dict__.setdefault("_fetcher", Fetcher())
        with self.span("fetch", step, weights.version) as s:
            handle = weights.handle()
            if handle.transport.needs_receiver and receiver is None:
                receiver = self.__dict__.get("_receiver")
                if receiver is None or receiver.load != load:
                    receiver = self.__dict__["_receiver"] = LocalReceiver(load, device)
            fetcher.fetch(handle, load, receiver)
            s["bytes"] = handle.nbytes
        self.__dict__["weights_transport"] = handle.transport.name
        self.__dict__["_timeline"] = weights.timeline

    def transport_used(self) -> str | None:
        """The transport this actor's last fetch went by (None before any)."""
        return self.__dict__.get("weights_transport")
