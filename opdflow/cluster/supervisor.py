"""Supervision of stage actors: a dead or stuck stage becomes a restart or a clear error.

Stateless stages (generators, rescorer, teacher, evaluator) run with Ray actor restarts
and task retries, so a killed process is replaced and the work it held is re-issued by
Ray with the same arguments (same request, same seed, same weights version). The driver
adds what Ray cannot know: a deadline on the batch the trainer waits for (a stage that
stops answering is killed and so restarted), and, when restarts run out, an error that
names the stage and the cause instead of a hang.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError


class StageFailed(RuntimeError):
    """A stage died more often than allowed, or failed; the run stops with this."""

    def __init__(self, stage: str, cause: str, hint: str = ""):
        self.stage, self.cause = stage, cause
        super().__init__(f"stage {stage} failed: {cause}" + (f"; {hint}" if hint else ""))


class StopRequested(Exception):
    """SIGINT/SIGTERM arrived: the run checkpointed at a step boundary and stopped."""


class LearnerLost(StageFailed):
    """A learner rank died (its process or its node): the training loop heals the learner
    (driver/healing.py); met anywhere else, the run stops with it."""

    def __init__(self, cause: str, ranks: list[int] | None = None):
        super().__init__(
            "learner", f"rank(s) {ranks if ranks is not None else '?'} lost ({cause})",
            "resume the run from its last checkpoint with --resume RUN_DIR",
        )  # fmt: skip
        self.cause, self.ranks = cause, ranks

    @classmethod
    def of(cls, error: Any, ranks: list[int] | None = None) -> LearnerLost:
        """From the error that told of it (an exception, or a finished ref holding one), in
        its first sentence."""
        cause = _cause(error) if isinstance(error, BaseException) else _cause_of(error)
        return cls(cause.split(". ", 1)[0].rstrip(".") + ".", ranks)


@dataclass
class Link:
    """One stage's part of a step's batch: who computes it and the ref of its output."""

    stage: str
    actor: Any
    ref: Any


def first_unready(links: list[Link]) -> Link | None:
    refs = [link.ref for link in links]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    ready_set = set(ready)
    return next((link for link in links if link.ref not in ready_set), None)


def actor_state(actor: Any) -> str | None:
    """The actor's state as the GCS sees it ("ALIVE", "RESTARTING", ...); None if unknown."""
    try:
        from ray._private import state  # the GCS table; the public state API needs a dashboard

        return state.actors(actor._actor_id.hex()).get("State")
    except Exception:
        return None


def await_links(
    links: list[Link],
    timeout_s: float,
    on_timeout: Callable[[str, str], None],
    watch: Sequence[Any] = (),
) -> float:
    """Wait for the last link; on each deadline kill the stuck stage's actor (Ray restarts
    it and re-runs its tasks) unless it is still starting or restarting (killing it then
    would only spend restarts). on_timeout(stage, action) hears of each deadline. `watch`:
    refs that finish only when a learner rank dies (LearnerLost is raised then). Returns
    seconds waited."""
    t0 = time.perf_counter()
    while True:
        ready, _ = ray.wait([links[-1].ref, *watch], num_returns=1, timeout=timeout_s)
        if ready and ready[0] != links[-1].ref:  # ready refs come in the order asked
            raise LearnerLost.of(ready[0])
        if ready:
            return time.perf_counter() - t0
        stuck = first_unready(links) or links[-1]
        state = actor_state(stuck.actor)
        if state in (None, "ALIVE"):
            on_timeout(stuck.stage, "killed")
            ray.kill(stuck.actor, no_restart=False)
        else:
            on_timeout(stuck.stage, f"waiting ({state.lower()})")


def diagnose(links: list[Link], error: BaseException) -> StageFailed:
    """Which stage of a batch failed, and why (called only on the failure path)."""
    for link in links:
        try:
            ray.get(link.ref, timeout=5)
        except GetTimeoutError:
            continue
        except RayError as exc:
            return StageFailed(
                link.stage, _cause(exc), "raise reliability.max_restarts or fix the cause"
            )
    return StageFailed(
        "learner", _cause(error), "resume the run from its last checkpoint with --resume RUN_DIR"
    )


def _cause_of(ref: Any) -> str:
    """The error a finished ref holds, as _cause words it ('' if it holds none)."""
    try:
        ray.get(ref, timeout=0)
    except RayError as exc:
        return _cause(exc)
    return ""


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:500]


class _StopFlag:
    requested = False


@contextlib.contextmanager
def stop_on_signals() -> Iterator[_StopFlag]:
    """SIGINT/SIGTERM (Ctrl-C, `ray job stop`) set a flag instead of killing the loop mid-step."""
    flag = _StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        flag.requested = True

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
