"""A run whose learner cannot see the checkpoint directory is refused at start.

A loopback cluster of this test's own runs in a private mount namespace where a directory
is covered by an empty tmpfs, while the driver (this process) sees it as it is: the stage
actors live on "another machine" without that storage. A checkpoint directory there is
refused before any step, naming reliability.checkpoint_dir and the fix (every other run of
the suite passes the same check with a directory both sides see). The cluster is stopped
by killing its process group (never `ray stop`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.processes import stop_group

from opdflow.cluster.connection import LOOPBACK_ENV, connect

ROOT = Path(__file__).resolve().parents[2]


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


def _reload_ray_auth() -> None:
    """Make this process's Ray read RAY_AUTH_MODE again (it caches the mode it first saw)."""
    from ray._private.authentication_test_utils import reset_auth_token_state

    reset_auth_token_state()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hidden_from_actors(tmp_path_factory, tiny):
    """A directory the driver sees and the cluster's actors see empty (RAY_ADDRESS is set to
    the cluster meanwhile)."""
    if not _can_unshare():
        pytest.skip("needs mount namespaces (`unshare -m`) to give the cluster its own view")
    import ray
    from support.waiting import wait_until

    if ray.is_initialized():
        ray.shutdown()  # this module's driver joins its own cluster
    hidden = tmp_path_factory.mktemp("not_shared")
    temp_dir = tempfile.mkdtemp(prefix="odfvis", dir="/tmp")  # short: unix socket paths
    gcs = _free_port()
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        **LOOPBACK_ENV,
        "PYTHONPATH": str(ROOT),
        "OPDFLOW_CACHE": os.environ.get("OPDFLOW_CACHE", str(Path.home() / ".cache/opdflow")),
    }
    env.pop("RAY_ADDRESS", None)
    head = [
        str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
        "--node-ip-address", "127.0.0.1", f"--port={gcs}", "--include-dashboard=false",
        "--num-cpus=2", "--min-worker-port=0", "--max-worker-port=0", f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]  # fmt: skip
    shell = f"mount -t tmpfs tmpfs '{hidden}' && exec " + " ".join(f"'{a}'" for a in head)
    log = open(Path(temp_dir) / "head.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", shell], env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    try:
        os.environ.update(RAY_AUTH_MODE="disabled", RAY_ADDRESS=f"127.0.0.1:{gcs}")
        _reload_ray_auth()

        def joined() -> bool:
            try:
                connect()  # through RAY_ADDRESS, as run_pipeline will
            except Exception:
                return False
            return True

        wait_until(joined, 120, lambda: (Path(temp_dir) / "head.log").read_text()[-2000:], 1.0)
        yield hidden
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _reload_ray_auth()  # later clusters of this session use the default auth again
        stop_group(proc)
        log.close()


def _cfg(checkpoint_dir: Path):
    from opdflow.config import PipelineConfig
    from opdflow.config.overrides import apply_overrides

    return apply_overrides(
        PipelineConfig(name="visible"),
        [
            "train.steps=1", "eval.every=1", "eval.prompts=4", "reliability.startup_timeout_s=300",
            f"reliability.checkpoint_dir={checkpoint_dir}",
        ],
    )  # fmt: skip


@pytest.mark.slow
def test_a_learner_that_cannot_see_the_checkpoint_dir_is_refused(hidden_from_actors, tmp_path):
    from opdflow.driver.controller import run_pipeline
    from opdflow.errors import ConfigError
    from opdflow.record.rundir import RunDir

    blind = _cfg(hidden_from_actors / "checkpoints")
    with pytest.raises(ConfigError) as refused:
        run_pipeline(blind, RunDir.create(blind, tmp_path / "blind"))
    message = str(refused.value)
    assert "reliability.checkpoint_dir" in message and "rank 0 on node" in message
    assert "cannot see it" in message and "shared" in message  # the fix: shared storage
    assert not (tmp_path / "blind" / "metrics.parquet").exists()  # refused before any step
