"""Fault handling and checkpoints: the timeouts, restarts and checkpoints a run survives by."""

from __future__ import annotations

from dataclasses import dataclass

from opdflow.config.rules import nonnegative, positive


@dataclass
class ReliabilityConfig:
    """Faults survived, checkpoints written."""

    checkpoint_every: int = 10
    """Write a checkpoint every this many learner steps (and on a clean stop); 0 = only on stop."""
    async_checkpoint: bool = True
    """Write checkpoints in the background (torch.distributed.checkpoint's asynchronous
    save): the learner waits only for a copy of its state in host memory, and the
    checkpoint is committed (renamed into place, `latest` moved) once every rank's part is
    written. False: the learner waits for the whole write. Each checkpoint's blocking
    seconds are the metrics column checkpoint_block_s and its "checkpoint" event's block_s."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (older ones are deleted after a newer one is complete)."""
    stage_timeout_s: float = 300.0
    """A batch not ready this many seconds after the trainer starts waiting for it: the stage
    holding it is treated as dead (its actor is killed and restarted, its work re-issued)."""
    startup_timeout_s: float = 600.0
    """Every stage actor must be running this many seconds after the run starts; actors Ray
    cannot place (too few CPUs/GPUs/custom resources) end the run with an error then."""
    max_restarts: int = 3
    """Restarts allowed per generator/rescorer/teacher/evaluator actor before the run stops."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (step_NNNNNN/ and `latest`); None = <run_dir>/checkpoints. Every
    learner worker writes its own shards there and the driver commits them, so on a cluster
    it must be storage every learner node and the driver's node share (NFS, Lustre, a
    mounted bucket): a run whose learner cannot see it is refused at start."""
    learner_recovery_timeout_s: float = 120.0
    """When a learner rank dies, a new learner group of resources.learner.workers ranks is
    placed if the cluster can place it within this many seconds; else it is placed with
    fewer ranks, down to resources.learner.min_workers."""
    max_learner_recoveries: int = 2
    """Learner losses a run heals from in place (new group, last checkpoint, rewind); one
    more ends the run, naming the checkpoint and the resume command."""

    def validate(self, path: str) -> None:
        nonnegative(f"{path}.checkpoint_every", self.checkpoint_every)
        positive(f"{path}.keep_checkpoints", self.keep_checkpoints)
        positive(f"{path}.stage_timeout_s", self.stage_timeout_s)
        positive(f"{path}.startup_timeout_s", self.startup_timeout_s)
        nonnegative(f"{path}.max_restarts", self.max_restarts)
        positive(f"{path}.learner_recovery_timeout_s", self.learner_recovery_timeout_s)
        nonnegative(f"{path}.max_learner_recoveries", self.max_learner_recoveries)
