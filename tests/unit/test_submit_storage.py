"""Where a submitted run lives and what a multi-node job needs, checked before anything is
submitted: --storage, --resume, the checkpoint rule; the interface a process group binds;
the line that names an actor's own error; the record of a node loss."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from opdflow.analysis.faults import node_losses
from opdflow.cli import main
from opdflow.cluster.startup import first_line
from opdflow.commands.jobs import entrypoint
from opdflow.commands.storage import check_checkpoint_dir, learner_may_leave_driver, run_dir_for
from opdflow.compute.interfaces import socket_env
from opdflow.config import PipelineConfig
from opdflow.config.overrides import apply_overrides
from opdflow.errors import ConfigError

DEMO = str(Path(__file__).resolve().parents[2] / "pipelines" / "tiny_cpu.py")


def _cfg(*overrides: str) -> PipelineConfig:
    return apply_overrides(PipelineConfig(name="t"), list(overrides))


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ((), None),
        (("resources.learner.workers=2",), "resources.learner.workers = 2"),
        (("resources.learner.num_gpus=1",), "resources.learner.num_gpus = 1"),
        (('resources.learner.resources={"learner": 1}',), "resources.learner.resources"),
        (('resources.placement.groups=[["learner", "teacher"]]',), "placement.groups"),
    ],
)
def test_when_the_learner_may_leave_the_drivers_node(overrides, why):
    found = learner_may_leave_driver(_cfg(*overrides))
    assert found == why if why is None else why in found


def test_a_learner_off_the_drivers_node_needs_checkpoints_on_an_absolute_path():
    spans = _cfg("resources.learner.workers=2")
    with pytest.raises(ConfigError, match=r"--storage PATH.*reliability.checkpoint_dir"):
        check_checkpoint_dir(spans, None)  # runs/NAME-TIME in the job's working directory
    with pytest.raises(ConfigError, match="working directory"):
        check_checkpoint_dir(spans, "runs/x")
    with pytest.raises(ConfigError, match=r"reliability\.checkpoint_dir = 'ckpt' is relative"):
        check_checkpoint_dir(
            _cfg("resources.learner.workers=2", "reliability.checkpoint_dir=ckpt"), "/s/x"
        )
    check_checkpoint_dir(spans, "/shared/runs/x")  # under --storage
    check_checkpoint_dir(
        _cfg("resources.learner.workers=2", "reliability.checkpoint_dir=/nfs/c"), None
    )
    check_checkpoint_dir(_cfg(), None)  # one learner beside the driver: as before


def test_storage_holds_the_run_directory():
    cfg = _cfg()
    assert run_dir_for(cfg, None, None, None) is None
    assert run_dir_for(cfg, None, "runs/a", None) == "runs/a"
    assert run_dir_for(cfg, "/nfs/runs", "a", None) == "/nfs/runs/a"
    assert run_dir_for(cfg, "/nfs/runs", None, "t-1") == "/nfs/runs/t-1"
    assert run_dir_for(cfg, "/nfs/runs", None, "/elsewhere/t-1") == "/elsewhere/t-1"
    assert run_dir_for(cfg, "/nfs/runs", None, None).startswith("/nfs/runs/t-")
    with pytest.raises(ConfigError, match="absolute"):
        run_dir_for(cfg, "nfs/runs", None, None)


def test_the_job_gets_resume_and_storage():
    line = entrypoint("p.py:f", ("a=1",), None, "/nfs/runs/x", "/nfs/runs")
    assert line.endswith("--set a=1 --resume /nfs/runs/x --storage /nfs/runs")


def _submit(*args: str):
    # the address is never contacted: each of these is refused before submitting
    return CliRunner().invoke(main, ["submit", *args, "--address", "http://127.0.0.1:9"])


def test_submit_refuses_a_spanning_learner_without_storage_before_submitting():
    res = _submit(DEMO, "--set", "resources.learner.workers=2")
    assert res.exit_code == 2, res.output
    assert "error: the learner may run on another node" in res.output
    assert "--storage PATH" in res.output and "cannot reach" not in res.output


def test_submit_resume_needs_storage_or_an_absolute_path():
    res = _submit(DEMO, "--resume", "runs/x")
    assert res.exit_code == 2 and "--storage" in res.output, res.output
    res = _submit(DEMO, "--resume", "/x", "--run-dir", "/y")
    assert res.exit_code == 2 and "either --run-dir" in res.output, res.output


def test_process_groups_bind_the_interface_of_the_node_address():
    assert socket_env("gloo", "127.0.0.1") == {"GLOO_SOCKET_IFNAME": "lo"}
    assert socket_env("nccl", "127.0.0.1") == {"NCCL_SOCKET_IFNAME": "=lo"}  # exact name
    assert socket_env("gloo", "198.18.255.254") == {}  # no interface holds it: backend's choice
    assert socket_env("mpi", "127.0.0.1") == {}


RAY_ERROR = """The actor died because of an error raised in its creation task, \x1b[36mray::LearnerActor.__init__()\x1b[39m (pid=16737, ip=198.18.0.12, actor_id=41, repr=<x>)
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 97, in init_process_group
    backend_class = ProcessGroupGloo(
                    ^^^^^^^^^^^^^^^^^
RuntimeError: Gloo connectFullMesh failed with [../gloo/transport/tcp/pair.cc:144] connect: Connection refused, remote=[127.0.0.1]:10126
second line of the message"""


def test_first_line_is_the_actors_own_exception():
    assert first_line(RuntimeError(RAY_ERROR)).startswith(
        "RuntimeError: Gloo connectFullMesh failed with"
    )
    assert first_line(ValueError("plain\nmore")) == "plain"
    assert first_line(RuntimeError("")) == "RuntimeError"


def test_node_losses_record_recovery_and_cost():
    events = [
        {"event": "node_lost", "node": "198.18.0.13", "node_id": "n3", "step": 10,
         "stages": ["generator"], "actors": ["generator[0]"], "steps_replayed": [10, 11]},
        {"event": "node_recovered", "node_id": "n3", "step": 12, "seconds": 14.5},
    ]  # fmt: skip
    metrics = [{"step": s, "step_s": 5.0 if s in (10, 11) else 1.0} for s in range(20)]
    (loss,) = node_losses(events, metrics)
    assert loss["steps_replayed"] == 2 and loss["seconds_to_recover"] == 14.5
    assert loss["seconds_lost"] == pytest.approx(8.0)  # steps 10-13 hit, 10 and 11 slow
    assert loss["updates_lost"] == pytest.approx(8.0)
    assert 0 < loss["share_of_updates_per_hour"] < 1
    assert loss["updates_per_hour_lost"] == pytest.approx(3600 - 3600 * 20 / 28)
    never = node_losses(events[:1], metrics)[0]
    assert never["seconds_to_recover"] is None and math.isfinite(never["seconds_lost"])


def test_bind_sockets_sets_the_backend_variable_unless_the_user_did(monkeypatch):
    from opdflow.compute.interfaces import bind_sockets

    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine")
    assert bind_sockets("nccl", "127.0.0.1") == {"NCCL_SOCKET_IFNAME": "=lo"}
    assert bind_sockets("gloo", "127.0.0.1") == {"GLOO_SOCKET_IFNAME": "mine"}  # the user's


def test_namespaces_say_why_not_without_root(monkeypatch):
    import os

    from opdflow.testbed import netns

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in netns.unavailable()
