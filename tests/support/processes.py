"""Stopping what a test started: its own process group, never anything found by name."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group `proc` leads (started with start_new_session=True), then
    SIGKILL it if it has not exited after `grace_s` seconds."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
