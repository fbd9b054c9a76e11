"""Ray's node table as run events: where stages run, nodes that join, nodes lost and what
ran on them, and what the run waits for until those stages are back.

When a node dies (its processes killed, its link down past Ray's health check) Ray
restarts the stateless stage actors that ran there on a node that can hold them, and re-runs
their calls; until such a node exists they wait. Without a record nobody sees why a run
stalled, nor what the loss cost. A NodeWatch polls the node table and the run's actors in
a thread of the driver (a few GCS lookups a second) and writes to events.jsonl:

- "placement": each actor's node, once at start; "node_joined": a node that joined later;
- "node_lost": a node that died, with the stages and actors that ran on it, the steps whose
  batches were in flight there (generated again: "steps_replayed") and Ray's reason;
- "waiting", every `remind_s` while a lost stage is not back: what it waits for (what the
  actor needs, and whether any alive node has it), also printed for a person;
- "node_recovered": every restartable actor of the lost node running again, seconds since
  the loss (not for a node that held only learner ranks: Ray does not restart those).

`node_losses` turns those events and the metrics into the summary's record of each loss:
steps replayed, seconds to recover and updates/hour lost. Learner ranks lost with a node
are named here; healing the learner is not this module's.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opdflow.config import ResourcesConfig
from opdflow.core.actor_name import stage_of

PERIOD_S = 1.0
"""Seconds between polls of the node table."""
REMIND_S = 10.0
"""Seconds between two "waiting" events (and lines) for the same lost stages."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Loss:
    """A node lost and the actors of this run that ran on it, until they are back."""

    node: str
    node_id: str
    step: int
    time: float
    actors: dict[str, str]
    """Actor id -> name of each actor of the run that ran there."""
    said: float = 0.0


class NodeWatch:
    """Polls Ray's node table in a driver thread and records what happens to the run's nodes
    (see the module docstring). `actors()` names the run's restartable stage actors;
    `pending` is the controller's in-flight steps ({step: object with `.links`, each link
    with `.actor` and `.ref`}), read to tell which batches a lost node held; `step` is set by
    the controller to the step it is at."""

    def __init__(
        self,
        run: Any,
        actors: Callable[[], dict[str, Any]],
        pending: dict[int, Any],
        resources: ResourcesConfig,
        say: Callable[[str], None] = _say,
        period_s: float = PERIOD_S,
        remind_s: float = REMIND_S,
    ):
        self.run, self.actors, self.pending, self.resources = run, actors, pending, resources
        self.say, self.period_s, self.remind_s = say, period_s, remind_s
        self.step = 0
        self.nodes: dict[str, dict[str, Any]] = {}
        """Node id -> {"ip", "alive", "resources"} as last seen."""
        self.where: dict[str, str] = {}
        """Actor id -> node id where it last ran."""
        self.open: list[Loss] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- thread

    def start(self) -> NodeWatch:
        """Poll once now (the "placement" event), then every period_s in a daemon thread."""
        self.poll()
        self._thread = threading.Thread(target=self._loop, name="node-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.poll()
            except Exception as exc:  # never take the run down for a record
                self.run.event("node_watch_error", error=f"{type(exc).__name__}: {exc}")

    # ---------------------------------------------------------------- one poll

    def poll(self, now: float | None = None) -> None:
        """Read the node table and the run's actors; record joins, losses, waits, recoveries."""
        import ray

        now = time.time() if now is None else now
        first = not self.nodes
        names = {a._actor_id.hex(): name for name, a in self.actors().items()}
        table = _job_actors()
        before_poll = dict(self.where)  # a lost actor may already run elsewhere: where it was
        for aid, info in table.items():
            if info.get("State") == "ALIVE" and (info.get("Address") or {}).get("NodeID"):
                self.where[aid] = info["Address"]["NodeID"]
        for n in ray.nodes():
            nid, alive = n["NodeID"], bool(n["Alive"])
            before = self.nodes.get(nid)
            self.nodes[nid] = {"ip": n["NodeManagerAddress"], "alive": alive,
                               "resources": dict(n.get("Resources") or {})}  # fmt: skip
            if first:
                continue
            if before is None and alive:
                self.run.event("node_joined", node=n["NodeManagerAddress"], node_id=nid,
                               step=self.step, resources=self.nodes[nid]["resources"])  # fmt: skip
            elif before is not None and before["alive"] and not alive:
                self._lost(nid, n.get("DeathReasonMessage", ""), names, table, before_poll, now)
        if first:
            self.run.event("placement", nodes={nid: {"ip": v["ip"], "resources": v["resources"]}
                                               for nid, v in self.nodes.items() if v["alive"]},
                           actors=self.placement(names, table))  # fmt: skip
        for loss in list(self.open):
            self._follow(loss, names, table, now)

    def placement(self, names: dict[str, str], table: dict[str, dict]) -> dict[str, str]:
        """Each actor of the run (learner ranks > 0 as "learner rank>0 N") -> its node's ip."""
        out, extra = {}, 0
        for aid, node in self.where.items():
            name = names.get(aid)
            if name is None:
                if (table.get(aid) or {}).get("ActorClassName") != "LearnerActor":
                    continue
                extra += 1
                name = f"learner rank>0 {extra}"
            out[name] = self.nodes.get(node, {}).get("ip", node)
        return out

    def _lost(
        self,
        nid: str,
        reason: str,
        names: dict[str, str],
        table: dict[str, dict],
        where: dict[str, str],
        now: float,
    ) -> None:
        ip = self.nodes[nid]["ip"]
        there = {aid for aid, node in where.items() if node == nid}
        ours = {aid: names[aid] for aid in there if aid in names}
        ranks = [aid for aid in there if aid not in names
                 and (table.get(aid) or {}).get("ActorClassName") == "LearnerActor"]  # fmt: skip
        stages = sorted({stage_of(n) for n in ours.values()} | ({"learner"} if ranks else set()))
        replayed = self._in_flight_on(set(there))
        self.run.event("node_lost", node=ip, node_id=nid, step=self.step, stages=stages,
                       actors=sorted(ours.values()) + [f"learner rank>0 ({len(ranks)})"] * bool(ranks),
                       steps_replayed=replayed, reason=reason)  # fmt: skip
        self.say(f"node {ip} lost at step {self.step} ({reason or 'no reason given'}): "
                 f"{', '.join(stages) or 'no stage of this run'} ran there"
                 + (f"; batches of steps {replayed} are generated again" if replayed else ""))  # fmt: skip
        restartable = {aid: name for aid, name in ours.items() if not name.startswith("learner")}
        loss = Loss(ip, nid, self.step, now, restartable, said=now - self.remind_s)  # say it now
        for aid in there:
            if self.where.get(aid) == nid:
                self.where.pop(aid)
        if restartable or not ranks:  # learner ranks alone: the learner's own recovery, not Ray's
            self.open.append(loss)

    def _in_flight_on(self, actor_ids: set[str]) -> list[int]:
        """Steps in flight whose batch is not complete and has a stage among `actor_ids`."""
        import ray

        out = []
        for step, job in sorted(list(self.pending.items())):
            links = list(job.links)
            if not any(getattr(link.actor, "_actor_id", None) is not None
                       and link.actor._actor_id.hex() in actor_ids for link in links):  # fmt: skip
                continue
            ready, _ = ray.wait([links[-1].ref], timeout=0)
            if not ready:
                out.append(step)
        return out

    def _follow(
        self, loss: Loss, names: dict[str, str], table: dict[str, dict], now: float
    ) -> None:
        """A lost node's actors: recovered once each runs again (or left the run); a loss
        whose actor Ray gave up on (DEAD: restarts spent) is closed without it."""
        waiting = []
        for aid, name in loss.actors.items():
            state = (table.get(aid) or {}).get("State")
            if aid not in names or state == "ALIVE":
                continue  # running again, or no longer the run's (the pool replaced it)
            if state == "DEAD":
                self.open.remove(loss)  # the run stops with that stage's error
                return
            waiting.append(name)
        if not waiting:
            self.open.remove(loss)
            self.run.event("node_recovered", node=loss.node, node_id=loss.node_id,
                           step=self.step, lost_step=loss.step,
                           seconds=round(now - loss.time, 3), actors=sorted(loss.actors.values()))  # fmt: skip
            self.say(f"stages lost with node {loss.node} are back after {now - loss.time:.1f} s")
            return
        if now - loss.said >= self.remind_s:
            loss.said = now
            text = "; ".join(self.waits_for(name) for name in waiting)
            self.run.event("waiting", step=self.step, node_lost=loss.node, actors=waiting,
                           seconds=round(now - loss.time, 3), message=text)  # fmt: skip
            self.say(
                f"waiting {now - loss.time:.0f} s for stages lost with node {loss.node}: {text}"
            )

    def waits_for(self, name: str) -> str:
        """What a lost actor waits for: what it needs, and whether an alive node has it."""
        res = getattr(self.resources, stage_of(name), None)
        need = {"CPU": res.num_cpus, "GPU": res.num_gpus, **res.resources} if res else {}
        need = {k: v for k, v in need.items() if v}
        fits = [v["ip"] for v in self.nodes.values()
                if v["alive"] and all(v["resources"].get(k, 0) >= a for k, a in need.items())]  # fmt: skip
        if not fits:
            return f"{name} needs {need or 'nothing'}, which no alive node has: a node with it must join"
        return f"{name} is restarting (needs {need or 'nothing'}; nodes that have it: {', '.join(fits)})"


def _job_actors() -> dict[str, dict[str, Any]]:
    """The GCS actor table of this job (the public state API needs the dashboard)."""
    import ray
    from ray._private import state

    job = ray.get_runtime_context().get_job_id()
    return state.actors(job_id=ray.JobID(bytes.fromhex(job)))
