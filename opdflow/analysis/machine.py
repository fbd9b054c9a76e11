"""FIFO servers on simulated time, alone or sharing a few cores: the simulator's machine.

Every stage actor serves its work in submission order, like a Ray actor; a task starts
once its dependencies are done. With `cores`, the busy servers share that many cores
(processor sharing), as on the small machine a run was measured on; without, each server
has its own hardware (a cluster).
"""

from __future__ import annotations


class Task:
    """Work on one FIFO server: `work` seconds at full speed, after `deps` are done."""

    __slots__ = ("deps", "done_s", "server", "work")

    def __init__(self, server: str, work: float, deps: tuple = ()):
        self.server, self.work, self.deps = server, max(work, 0.0), deps
        self.done_s: float | None = None


class Machine:
    """FIFO servers advancing in time; with `cores`, the busy ones share that many cores
    (processor sharing: n busy servers each run at min(1, cores / n) of full speed)."""

    def __init__(self, cores: float | None):
        self.cores, self.now = cores, 0.0
        self.queues: dict[str, list[Task]] = {}

    def submit(self, task: Task) -> Task:
        self.queues.setdefault(task.server, []).append(task)
        return task

    def unfinished(self, server: str) -> int:
        return len(self.queues.get(server, ()))

    def run_until(self, task: Task) -> None:
        """Advance time until `task` is done."""
        while task.done_s is None:
            busy = [
                q[0]
                for q in self.queues.values()
                if q and all(d.done_s is not None for d in q[0].deps)
            ]
            if not busy:
                raise RuntimeError(f"simulator deadlock waiting for {task.server}")  # a bug
            speed = 1.0 if self.cores is None else min(1.0, self.cores / len(busy))
            dt = min(t.work for t in busy) / speed
            self.now += dt
            for t in busy:
                t.work -= dt * speed
                if t.work <= 1e-12:
                    t.done_s = self.now
                    self.queues[t.server].pop(0)
