"""Stopping what a test started: its own process group, never anything found by name."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group `proc` leads (started with start_new_session=True), then
    SIGKILL it if it has not exited after `grace_s` seconds."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_python_group(code: str, env: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
    """`python -c CODE` in a process group of its own (a Ray cluster it starts included),
    SIGKILLed whole once it ends or after `timeout_s` (a liveness guard, not a speed
    check): (return code, stdout, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its cluster is left
    return proc.returncode, out, err
