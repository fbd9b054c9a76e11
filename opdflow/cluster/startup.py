"""Actors that start: each one's own error when it fails, never a hang or a guess.

An actor whose constructor raises is dead at once, but nothing says so until someone
calls it; the run then waited out its start-up timeout and blamed resources. Here:
`first_line` turns Ray's error about a dead actor or a failed call into the line that
names the actor's own exception ("RuntimeError: Gloo connectFullMesh failed ..."),
`where_started` tells an actor that is still constructing from one Ray cannot place, and
`build_watching` runs a constructor that waits for peers (a process group's rendezvous)
while it watches them start, so a peer that fails ends the wait with that peer's error.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)\b.*")


def first_line(exc: BaseException) -> str:
    """The line of `exc` that names the actor's own exception, e.g. "RuntimeError: Gloo
    connectFullMesh failed ...": for a Ray error about a dead actor or a failed call, the
    line after its traceback; else its first line. At most 500 characters."""
    lines = [_ANSI.sub("", line).rstrip() for line in str(exc).splitlines()]
    last_file = max((i for i, line in enumerate(lines) if line.lstrip().startswith('File "')),
                    default=None)  # fmt: skip
    if last_file is not None:
        for line in lines[last_file + 1 :]:
            if line and not line[0].isspace():
                return line[:500]
    named = [line for line in lines if _EXCEPTION_LINE.match(line)]
    text = named[-1] if named else next((line for line in lines if line.strip()), "")
    return (text or type(exc).__name__)[:500]


def node_in(exc: BaseException) -> str | None:
    """The node address Ray names in an actor error ("... ip=10.0.0.2, ..."), if any."""
    found = re.search(r"\bip=([0-9a-fA-F.:]+)", str(exc))
    return found.group(1) if found else None


def where_started(actor: Any) -> str | None:
    """The node address of an actor whose process exists (constructing or running); None
    while Ray has not placed it (no node has what it asks) or when unknown."""
    try:
        from ray._private import state  # the GCS table; the public state API needs a dashboard

        info = state.actors(actor._actor_id.hex())
    except Exception:
        return None
    address = info.get("Address") or {}
    return address.get("IPAddress") or None if info.get("Pid") else None


def build_watching(build: Callable[[], T], peers: dict[str, Any], poll_s: float = 1.0) -> T:
    """`build()` (a constructor that blocks until its peers join it) while watching each
    peer's start, given as the ref of a first call to it (`peers`: name -> ref): a peer
    that fails to start raises RuntimeError with its name, node and first line here, so
    the caller fails with the cause instead of waiting for a peer that is gone."""
    import ray
    from ray.exceptions import RayError

    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = build()
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target, name="build-watching", daemon=True)
    thread.start()
    pending = dict(peers)
    while thread.is_alive():
        thread.join(poll_s)
        if not pending:
            continue
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=0)
        for name, ref in list(pending.items()):
            if ref not in ready:
                continue
            del pending[name]
            try:
                ray.get(ref)
            except RayError as exc:
                node = node_in(exc)
                raise RuntimeError(
                    f"{name}{f' (node {node})' if node else ''} failed to start: {first_line(exc)}"
                ) from None
    if "error" in result:
        raise result["error"]
    return result["value"]
