"""Waiting on a real cluster: poll until something holds, or give up with what was seen.

A give-up limit is a liveness guard (a hang becomes a failure that says what it waited
for), never a speed check: the limits are minutes, far above any normal wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], bool], limit_s: float, seen: Callable[[], object], poll_s: float = 0.2
) -> None:
    """Call `condition` every poll_s seconds until it is true; after limit_s raise
    TimeoutError with `seen()` (the state to debug from)."""
    give_up = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > give_up:
            raise TimeoutError(f"still waiting after {limit_s:.0f} s; saw: {seen()}")
        time.sleep(poll_s)
