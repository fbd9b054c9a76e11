"""`opdflow submit/status/logs/stop` against a real `ray start` cluster on loopback.

The cluster is this test's own: `ray start --head --block` in its own process group, on
free ports, with a private temp dir, stopped by killing that group (never `ray stop`,
which would stop every Ray process on the machine). It runs without authentication, so
it must be loopback only: `--node-ip-address 127.0.0.1` alone is not (Ray 2.60 replaces
it with the interface address), cluster.connection.LOOPBACK_ENV makes it so, and a test reads the
bound sockets of the group's processes to check.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.processes import stop_group

from opdflow.cli import main
from opdflow.cluster.connection import LOOPBACK_ENV

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = str(ROOT / "pipelines" / "tiny_cpu.py:short_answers")
TINY = ["--set", "train.steps=3", "--set", "eval.every=3", "--set", "eval.prompts=8"]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def head(tiny):
    """(dashboard address, `ray start` process) of a private single-node cluster (2 CPUs)."""
    ray_bin = Path(sys.executable).parent / "ray"
    temp_dir = tempfile.mkdtemp(prefix="odfsub", dir="/tmp")  # short: unix socket paths
    (gcs, dash, nm, om, client, agent_http, agent_grpc, renv, metrics) = _free_ports(9)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        **LOOPBACK_ENV,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),  # the job's driver and actors import this checkout's opdflow
        "OPDFLOW_CACHE": os.environ.get("OPDFLOW_CACHE", str(Path.home() / ".cache/opdflow")),
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [
        str(ray_bin), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
        f"--port={gcs}", f"--node-manager-port={nm}", f"--object-manager-port={om}",
        f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent_http}",
        f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={renv}",
        f"--metrics-export-port={metrics}", "--min-worker-port=0", "--max-worker-port=0",
        "--num-cpus=2", f"--temp-dir={temp_dir}", "--disable-usage-stats",
    ]  # fmt: skip
    log = open(Path(temp_dir) / "ray-start.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    address = f"http://127.0.0.1:{dash}"
    saved_auth = os.environ.get("RAY_AUTH_MODE")
    try:
        from ray.job_submission import JobSubmissionClient

        deadline = time.time() + 120
        while True:
            try:
                os.environ["RAY_AUTH_MODE"] = "disabled"
                JobSubmissionClient(address)
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    log.flush()
                    pytest.fail(
                        "ray start failed:\n" + (Path(temp_dir) / "ray-start.log").read_text()
                    )
                time.sleep(1)
        yield address, proc
    finally:
        if saved_auth is None:  # never leak the test cluster's auth mode into later tests
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved_auth
        stop_group(proc, 10)
        log.close()


@pytest.fixture(scope="module")
def ray_head(head):
    """Dashboard address of the private cluster."""
    return head[0]


def test_the_unauthenticated_test_cluster_is_loopback_only(head):
    from support.sockets import is_loopback, sockets
    from support.waiting import wait_until

    # the dashboard answers before the raylet listens: wait for both servers to show
    seen = {}

    def servers_up() -> bool:
        seen["listening"], seen["connected"] = sockets(head[1].pid)
        return {"gcs_server", "raylet"} <= {name for name, _, _ in seen["listening"]}

    wait_until(servers_up, 120, lambda: seen)
    listening, connected = seen["listening"], seen["connected"]
    assert not [s for s in listening if not is_loopback(s[1])], listening
    assert not [s for s in connected if not is_loopback(s[1])], connected


def _cli(args: list[str], **env: str):
    env = {"RAY_AUTH_MODE": "disabled", **env}
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def test_submit_needs_an_explicit_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    res = _cli(["submit", PIPELINE, *TINY])
    assert res.exit_code == 2
    assert "--address" in res.output and "RAY_ADDRESS" in res.output


def test_unreachable_address_is_a_clear_error():
    (port,) = _free_ports(1)
    res = _cli(["submit", PIPELINE, *TINY, "--address", f"http://127.0.0.1:{port}"])
    assert res.exit_code == 1
    assert f"cannot reach the Ray Jobs API at http://127.0.0.1:{port}" in res.output


def test_submit_runs_the_tiny_pipeline_and_reads_the_summary_back(ray_head):
    res = _cli(["submit", PIPELINE, *TINY, "--address", ray_head, "--wait"])
    assert res.exit_code == 0, res.output
    job_id = res.output.splitlines()[0].strip()
    assert job_id.startswith("opdflow-tiny-cpu-")
    assert "opdflow run summary" in res.output
    # the same job through RAY_ADDRESS: status with the summary, logs with the summary line
    st = _cli(["status", job_id], RAY_ADDRESS=ray_head)
    assert st.exit_code == 0 and f"{job_id}: SUCCEEDED" in st.output, st.output
    import json

    summary = json.loads(st.output.splitlines()[1])
    assert summary["steps"] == 3
    assert summary["heldout_version_end"] == 3
    logs = _cli(["logs", job_id, "--address", ray_head])
    assert "OPDFLOW_SUMMARY_JSON: " in logs.output


def test_a_failed_job_reports_the_tail_of_its_logs(ray_head, tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    bad = ["--set", f"models.student={missing}", "--set", f"models.teacher={missing}"]
    res = _cli(["submit", PIPELINE, *TINY, *bad, "--address", ray_head, "--no-wait"])
    assert res.exit_code == 0, res.output
    job_id = res.output.strip()
    from opdflow.commands.jobs import job_client, wait_for_job

    status, _ = wait_for_job(job_client(ray_head), job_id)
    assert status == "FAILED"
    st = _cli(["status", job_id, "--address", ray_head])
    assert st.exit_code == 1
    # a check that refuses the job: one line in its status and its logs, no traceback
    first = st.output.splitlines()[0]
    assert first.startswith(f"{job_id}: FAILED: error: ") and str(missing) in first, st.output
    logs = _cli(["logs", job_id, "--address", ray_head]).output
    assert "Traceback" not in logs and "run directory: " in logs
    waited = _cli(["submit", PIPELINE, *TINY, *bad, "--address", ray_head, "--wait"])
    assert waited.exit_code == 1
    assert "FAILED" in waited.output and "last 40 lines of its logs" in waited.output
    assert str(missing) in waited.output


def test_stop_a_running_job(ray_head):
    res = _cli(["submit", PIPELINE, "--steps", "400", "--address", ray_head, "--no-wait"])
    job_id = res.output.strip()
    stop = _cli(["stop", job_id, "--address", ray_head])
    assert stop.exit_code == 0 and "stop requested" in stop.output, stop.output
    from opdflow.commands.jobs import job_client, wait_for_job

    status, _ = wait_for_job(job_client(ray_head), job_id)
    assert status == "STOPPED"
