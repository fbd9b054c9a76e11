"""The driver's live versions: refs by version, the bytes they pin, the k_max + 2 bound.

A run holds at most the staleness policy's `live_versions` weights versions; `WeightStore`
keeps their `WeightsRef`s, counts the bytes they pin and turns a version that is never
released (which would fill memory) into an error. Dropping a ref lets Ray free the version.
"""

from __future__ import annotations

from typing import Any

from opdflow.weights.version import WeightsRef


def object_nbytes(ref: Any) -> int:
    """Bytes of a sealed object in Ray's object store (asks its owner; no data moves)."""
    from ray.experimental import get_object_locations

    return int(get_object_locations([ref])[ref]["object_size"])


class WeightStore:
    """Versioned ObjectRefs held by the driver; dropping a ref lets Ray free the version.

    It also keeps each version's bytes (where they live depends on the transport: the
    object store, or the learner's host staging for the collective), so a run reports the
    bytes its live versions pin (`bytes_live`) and their peak, and `check_bound` turns a
    version that is never released (which would fill memory) into an error.
    """

    def __init__(self) -> None:
        self._refs: dict[int, WeightsRef] = {}
        self._nbytes: dict[int, int] = {}
        self.released = 0
        self.peak_live = 0
        self.peak_bytes = 0

    def publish(self, weights: WeightsRef) -> None:
        """Hold `weights` as its version (its size asked of the object store if not given)."""
        nbytes = object_nbytes(weights.ref) if weights.nbytes is None else weights.nbytes
        self._refs[weights.version] = weights
        self._nbytes[weights.version] = int(nbytes)
        self.peak_live = max(self.peak_live, len(self._refs))
        self.peak_bytes = max(self.peak_bytes, self.bytes_live())

    @property
    def latest(self) -> int:
        return max(self._refs) if self._refs else -1

    def get(self, version: int) -> WeightsRef:
        if version not in self._refs:
            raise KeyError(f"weights version {version} is not held (live: {sorted(self._refs)})")
        return self._refs[version]

    def release_below(self, version: int) -> None:
        """Forget every version older than `version` (the oldest one still needed)."""
        for v in [v for v in self._refs if v < version]:
            del self._refs[v]
            del self._nbytes[v]
            self.released += 1

    def live_versions(self) -> list[int]:
        return sorted(self._refs)

    def bytes_live(self) -> int:
        """Bytes of the versions held (each version's buffer size)."""
        return sum(self._nbytes.values())

    def check_bound(self, max_versions: int) -> None:
        """Raise if more than `max_versions` (a policy's `live_versions`) versions are held."""
        if len(self._refs) > max_versions:
            raise RuntimeError(
                f"{len(self._refs)} weight versions are held ({self.live_versions()}, "
                f"{self.bytes_live() / 2**20:.1f} MiB) but at most "
                f"{max_versions} may be live at this staleness bound: a version is not being "
                "released (WeightStore.release_below), and memory would fill"
            )
