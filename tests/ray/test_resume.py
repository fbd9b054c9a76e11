"""Checkpoint and resume: a clean stop continues exactly at k = 0; a SIGKILLed driver of an
asynchronous run resumes from its last checkpoint, each step trained once within the bound."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opdflow.cluster.supervisor import StopRequested
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.driver.controller import run_pipeline
from opdflow.record.checkpoint import checkpoints_dir, load_latest
from opdflow.record.rundir import RunDir, read_table

ROOT = Path(__file__).resolve().parents[2]
DETERMINISTIC = (
    "step",
    "version",
    "staleness",
    "k",
    "loss",
    "train_kl",
    "grad_norm",
    "tokens",
    "responses",
    "d_engine_k1",
    "d_engine_k3",
    "d_engine_exact",
    "d_stale_k1",
    "d_stale_k3",
    "d_total_k1",
    "d_total_k3",
    "skipped",
)


def _cfg(k, steps=8):
    return apply_overrides(
        PipelineConfig(name="resume", seed=7),
        [
            f"staleness.k={k}",
            f"train.steps={steps}",
            "eval.every=4",
            "eval.prompts=8",
            "reliability.checkpoint_every=3",
        ],
    )


def _interrupted(cfg, path, stop_after):
    """Run until a SIGTERM after `stop_after`, then resume from the checkpoint it wrote."""

    def on_step(row):
        if row["step"] == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)

    run = RunDir.create(cfg, path)
    with pytest.raises(StopRequested, match="resume with --resume"):
        run_pipeline(cfg, run, on_step=on_step)
    ckpt = load_latest(checkpoints_dir(path))
    assert ckpt is not None
    assert ckpt.step == stop_after + 1  # a clean stop checkpoints at the step boundary
    return run_pipeline(cfg, RunDir.open(path), resume=ckpt)


def _same(a, b):
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


def test_sync_resume_matches_an_uninterrupted_run_exactly(tmp_path, ray_local, tiny):
    cfg = _cfg(k=0)
    run_pipeline(cfg, RunDir.create(cfg, tmp_path / "full"))
    _interrupted(cfg, tmp_path / "resumed", stop_after=4)
    full = read_table(tmp_path / "full" / "metrics.parquet")
    resumed = read_table(tmp_path / "resumed" / "metrics.parquet")
    assert len(full) == len(resumed) == 8
    for a, b in zip(full, resumed):
        for key in DETERMINISTIC:
            assert _same(a[key], b[key]), (a["step"], key, a[key], b[key])
    key = lambda r: (r["version"], r["prompt_index"])  # noqa: E731
    held_full = sorted(read_table(tmp_path / "full" / "heldout.parquet"), key=key)
    held_resumed = sorted(read_table(tmp_path / "resumed" / "heldout.parquet"), key=key)
    assert held_full == held_resumed


@pytest.mark.slow
def test_a_killed_driver_resumes_from_its_last_checkpoint(tmp_path, tiny):
    run_dir = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "opdflow.cli",
        "run",
        str(ROOT / "pipelines" / "tiny_cpu.py:short_answers"),
        "--steps",
        "16",
        "--set",
        "reliability.checkpoint_every=4",
        "--set",
        "eval.prompts=8",
    ]
    proc = subprocess.Popen(
        [*args, "--run-dir", str(run_dir)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        ckpt = load_latest(checkpoints_dir(run_dir))
        if ckpt is not None and ckpt.step >= 4:
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray cluster it started
    proc.wait()
    killed_at = load_latest(checkpoints_dir(run_dir)).step
    assert killed_at < 16
    done = subprocess.run(
        [*args, "--resume", str(run_dir)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming at step {killed_at}" in done.stderr
    metrics = read_table(run_dir / "metrics.parquet")
    assert [r["step"] for r in metrics] == list(range(16))
    assert all(0 <= r["step"] - r["version"] <= 2 for r in metrics)  # async (k = 2) resume
    record = json.loads((run_dir / "summary.json").read_text())["trained_steps_record"]
    assert [s for s, _ in record] == list(range(16))  # the learner trained each step once
