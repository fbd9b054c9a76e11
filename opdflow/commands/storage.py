"""Where a submitted run lives: durable storage every node mounts, named by the user.

Without it, a job's run directory is relative to the job's working directory, which Ray
Jobs unpacks into the head's temporary session directory (gone when the cluster restarts,
shared by every job with the same package hash) and to a different path on each node.
`opdflow submit --storage PATH` (as Ray Train's `storage_path`) puts the run directory,
and so its checkpoints, under PATH: a path every node mounts (NFS, Lustre, a mounted
bucket), where `opdflow status`/`logs` say it is and `--resume` finds it again.

A learner that may run on another node than the job's driver (more than one worker, GPUs,
custom resources or a placement group: the client cannot know where Ray puts it) writes
checkpoint shards every learner node and the driver must see: such a job is refused
before it is submitted unless its checkpoints land on an absolute path (under --storage,
or reliability.checkpoint_dir). The job then checks that every learner rank sees it.
"""

from __future__ import annotations

import time
from pathlib import PurePosixPath

from opdflow.config import PipelineConfig
from opdflow.errors import ConfigError


def learner_may_leave_driver(cfg: PipelineConfig) -> str | None:
    """Why the learner may run on a node other than the job's driver (the head), as the
    field that says so; None when it runs beside the driver (one worker, no GPU, no custom
    resource, no placement group: Ray places it on the driver's node when it can)."""
    r = cfg.resources.learner
    if r.workers > 1:
        return f"resources.learner.workers = {r.workers}"
    if r.num_gpus > 0:
        return f"resources.learner.num_gpus = {r.num_gpus:g}"
    if r.resources:
        return f"resources.learner.resources = {r.resources}"
    if any("learner" in group for group in cfg.resources.placement.groups):
        return "resources.placement.groups holds the learner"
    return None


def run_dir_for(
    cfg: PipelineConfig, storage: str | None, run_dir: str | None, resume: str | None
) -> str | None:
    """The run directory a job writes (or resumes): under `storage` when given (a relative
    --run-dir or --resume is taken relative to it; default NAME-TIME), else --run-dir or
    --resume as given (None: the job picks runs/NAME-TIME in its working directory)."""
    given = resume or run_dir
    if storage is None:
        return given
    root = PurePosixPath(storage)
    if not root.is_absolute():
        raise ConfigError(
            f"--storage {storage}: give an absolute path that every node of the cluster mounts"
        )
    name = given or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return str(root / name)


def check_checkpoint_dir(cfg: PipelineConfig, run_dir: str | None) -> None:
    """Refuse, before submitting, a job whose learner may run off the driver's node while
    its checkpoints would land on a relative path (the job's working directory: on each
    node another one), with the fix."""
    why = learner_may_leave_driver(cfg)
    if why is None:
        return
    ckpt = cfg.reliability.checkpoint_dir
    if ckpt is not None and not PurePosixPath(ckpt).is_absolute():
        raise ConfigError(
            f"reliability.checkpoint_dir = {ckpt!r} is relative, and the learner may run on "
            f"another node than the job's driver ({why}): give an absolute path on storage "
            "every node mounts, or submit with --storage PATH and leave it unset"
        )
    if ckpt is None and (run_dir is None or not PurePosixPath(run_dir).is_absolute()):
        raise ConfigError(
            f"the learner may run on another node than the job's driver ({why}), and its "
            "checkpoints would go to the run directory inside the job's working directory "
            "(a temporary copy on each node): submit with --storage PATH (storage every node "
            "mounts; the run directory and checkpoints go under it) or set "
            "reliability.checkpoint_dir to an absolute path on such storage"
        )
