"""A portable tiny build yields the same weights on any x86-64 CPU: its float kernels are pinned.

Two machines are emulated on this one by what they would make torch and MKL pick: an old
CPU (ATen's scalar kernels, MKL limited to SSE4.2) and this CPU as it is. Unpinned, the two
builds differ (so the emulation reaches the kernels and the check can fail); built with
models.tiny.portable_kernels, they are equal byte for byte. A default build in the child
process equals one in this process, as builds were made before (their cache keys stand).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from opdflow.config import TaskSpec, TinyModelSpec
from opdflow.testbed.zoo import build, build_env, ensure_tiny

pytestmark = [
    pytest.mark.skipif(
        platform.machine().lower() not in ("x86_64", "amd64"), reason="kernels are pinned on x86-64"
    ),
    pytest.mark.slow,  # builds in child processes (minutes)
]

# small: every float kernel a build runs (init, forward, backward, AdamW, the greedy
# check) runs at least once; the weights differ after one step when the kernels do
SPEC = TinyModelSpec(student="carry_blind", teacher_steps=3, carry_blind_steps=1, batch_size=8)
PORTABLE = dataclasses.replace(SPEC, portable_kernels=True)
TASK = TaskSpec(worked=True, num_train=32, num_heldout=4)
OLD_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


def _weights(root: Path) -> dict[str, str]:
    return {
        part: hashlib.sha256((root / part / "model.safetensors").read_bytes()).hexdigest()
        for part in ("teacher", "student")
    }


def _unpinned_build(root: Path, machine: dict[str, str]) -> dict[str, str]:
    spec = {"model": dataclasses.asdict(SPEC), "task": dataclasses.asdict(TASK)}
    subprocess.run(
        [sys.executable, "-m", "opdflow.testbed.zoo", json.dumps(spec), str(root)],
        env={**build_env(portable=False), **machine},
        check=True,
        capture_output=True,
    )
    return _weights(root)


@pytest.fixture(scope="module")
def default_here(tmp_path_factory):
    """A default (unpinned) build on this CPU, by ensure_tiny in its child process; shared
    by the two tests that compare it with another build."""
    return ensure_tiny(SPEC, TASK, str(tmp_path_factory.mktemp("zoo")), log=lambda _: None)


def test_unpinned_builds_differ_between_the_emulated_machines(tmp_path, default_here):
    assert _unpinned_build(tmp_path / "old", OLD_CPU) != _weights(default_here.root)


def test_portable_builds_are_equal_on_the_emulated_machines(tmp_path, monkeypatch):
    this = ensure_tiny(PORTABLE, TASK, str(tmp_path / "this"), log=lambda _: None)
    for name, value in OLD_CPU.items():
        monkeypatch.setenv(name, value)
    old = ensure_tiny(PORTABLE, TASK, str(tmp_path / "old"), log=lambda _: None)
    assert _weights(old.root) == _weights(this.root)
    assert this.info["kernels"]["aten_cpu_capability"] == "AVX2"
    assert this.info["kernels"]["mkl_cbwr"] == "COMPATIBLE"
    assert os.environ["ATEN_CPU_CAPABILITY"] == "default"  # the caller's env is left alone


def test_a_default_build_in_the_child_equals_one_in_this_process(tmp_path, default_here):
    assert default_here.info["kernels"]["mkl_cbwr"] == os.environ.get("MKL_CBWR", "")
    build(SPEC, TASK, tmp_path / "here", lambda _: None)
    assert _weights(tmp_path / "here") == _weights(default_here.root)
