"""A learner that owns its process ends it: `close` lets a background save finish and takes
the gloo group down on every rank, so the processes exit cleanly (a group left to
interpreter exit can abort it with "terminate called without an active exception")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys
import torch
import torch.distributed as dist
from opdflow.compute.fsdp import DistSpec
from opdflow.config import TrainConfig
from opdflow.stages.learner import Learner

student, out, rank, init = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
learner = Learner(student, TrainConfig(), device="cpu", dist=DistSpec(rank, 2, init))
learner.save_checkpoint(out, background=True)
learner.close()
print("initialized after close:", dist.is_initialized())
"""


def test_close_writes_the_save_and_ends_the_group_on_every_rank(tiny, tmp_path):
    from opdflow.compute.fsdp import free_port

    init = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "ckpt"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tiny.student), str(out), str(rank), init],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(2)
    ]
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-3000:]
        assert "initialized after close: False" in stdout, stdout
    assert (out / ".metadata").is_file()  # the background save is whole: every rank's shards
    assert (out / "learner.json").is_file()
