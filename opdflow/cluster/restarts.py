"""Stage actor restarts, on the record: from Ray's own count, to events, metrics and summary.

Ray restarts a dead generator, rescorer, teacher or evaluator actor by itself and re-runs
the calls it held, so a run survives; without this nobody would see it happen. After each
learner step the driver reads every actor's restart count from Ray's control store (GCS:
one local lookup per actor, no dashboard needed) and records each new restart with the
stage, the actor and the step it hit (the step whose wait or work it fell in): one
"restart" event in events.jsonl per restart, the step's `restarts` in metrics.parquet,
and per stage in the summary.

Restarts cost time: a new process, models loaded again, the lost work done again. The
summary compares the steps restarts hit (and the step after each, where a restarted
replica reloads weights) with the others: `restart_slowdown` is the share of updates/hour
the run lost to them, and the summary table flags it from RESTART_FLAG_SHARE on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opdflow.core.actor_name import stage_of

RESTART_FLAG_SHARE = 0.10
"""The summary flags a run whose restarts cost at least this share of its updates/hour."""


def ray_restart_count(actor: Any) -> int | None:
    """Ray's restart count of an actor (GCS actor table); None when unknown."""
    try:
        from ray._private import state  # the public state API needs the dashboard

        return int(state.actors(actor._actor_id.hex())["NumRestarts"])
    except Exception:
        return None


class RestartLog:
    """Restart counts seen so far, per actor (keyed by Ray actor id, so a replaced replica
    is a new actor)."""

    def __init__(self, count: Callable[[Any], int | None] = ray_restart_count):
        self.count = count
        self.seen: dict[str, int] = {}
        self.per_stage: dict[str, int] = {}

    def poll(self, actors: dict[str, Any], step: int) -> list[dict[str, Any]]:
        """New restarts since the last poll: one dict per restart (stage, actor, step, and
        Ray's count for that actor after it), in actor order."""
        out = []
        for name, actor in actors.items():
            total = self.count(actor)
            if total is None:
                continue
            key = actor._actor_id.hex() if hasattr(actor, "_actor_id") else name
            before = self.seen.get(key, 0)
            self.seen[key] = total
            for n in range(before + 1, total + 1):
                out.append(
                    {"stage": stage_of(name), "actor": name, "step": step, "ray_restarts": n}
                )
                self.per_stage[stage_of(name)] = self.per_stage.get(stage_of(name), 0) + 1
        return out
