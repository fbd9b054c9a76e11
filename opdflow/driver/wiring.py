"""The runtime one run is wired to: what it reads, its placement, trackers and checkpoints.

What a run reads is checked, resolved and loaded once, before a run directory, a sink
or Ray exists (`RunInputs.read`): the session does it and passes the result down, so the
stages and the controller never resolve a model path, a prompt file, a tracker URI or a
checkpoint directory again. `RunWiring` then holds what the run's stages live in (Ray placement
groups) and what the loop writes through (trackers, checkpoints, the profiler, the
exported student); closing it releases them. Creating the stage actors is assembly.py's.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opdflow.cluster.nodes import NodeWatch
from opdflow.cluster.placement import Placement, grouped_actors
from opdflow.cluster.supervisor import StageFailed
from opdflow.config import PipelineConfig
from opdflow.errors import ConfigError
from opdflow.inputs.data import PromptSet, load_prompts
from opdflow.inputs.models import ResolvedModels, resolve_models
from opdflow.record import checkpoint
from opdflow.record.checkpoint import Checkpoint
from opdflow.record.profiler import Profiler
from opdflow.record.rundir import RunDir
from opdflow.record.trackers import Trackers, check_trackers, open_trackers


def checkpoint_root(cfg: PipelineConfig, run_path: Path, resume: Checkpoint | None) -> Path:
    """Where the run's checkpoints go (reliability.checkpoint_dir, else the run directory's);
    a new run refuses a root that already holds another run's checkpoints."""
    root = checkpoint.checkpoints_dir(run_path, cfg.reliability.checkpoint_dir)
    if resume is None and (other := checkpoint.load_latest(root)) is not None:
        raise ConfigError(
            f"reliability.checkpoint_dir = {str(root)!r} already holds checkpoints of a run "
            f"(latest: {other.path.name}); give each run its own directory, or continue that "
            "run with --resume"
        )
    return root


@dataclass(frozen=True)
class RunInputs:
    """What one run reads, checked and loaded once before it starts, and passed down."""

    models: ResolvedModels
    """Local paths of the student, teacher, tokenizer and prompt files."""
    tokenizer: Any
    train_set: PromptSet
    heldout_set: PromptSet
    """The first eval.prompts rows of the held-out file."""
    checkpoint_root: Path
    """Where checkpoints go (checkpoint_root)."""

    @classmethod
    def read(cls, cfg: PipelineConfig, root: Path, log: Callable[[str], None] = print) -> RunInputs:
        """Check the tracker settings and the vLLM version, resolve the student and teacher
        (built once if "tiny"), load the tokenizer and the prompts (every reference answer
        graded once): bad input is refused here, before a run directory, a sink or Ray."""
        from opdflow.inputs.grader import make_grader
        from opdflow.inputs.models import load_tokenizer

        check_trackers(cfg)
        if cfg.engine.kind == "vllm":
            from opdflow.engines.vllm_version import check_vllm_version, installed_vllm

            check_vllm_version(installed_vllm())
        models = resolve_models(cfg, log=log)
        tok = load_tokenizer(models.tokenizer)
        d, n = cfg.data, cfg.eval.prompts
        grader = make_grader(d.grader, d.grader_timeout_s)  # checks every row's reference
        train = load_prompts(models.train, tok, d.max_prompt_tokens, grader=grader)
        heldout = load_prompts(models.heldout, tok, d.max_prompt_tokens, limit=n, grader=grader)
        if len(heldout) < n:
            raise ConfigError(
                f"eval.prompts = {n} but {models.heldout} has only {len(heldout)} rows"
            )
        return cls(models, tok, train, heldout, root)

    @classmethod
    def for_run(cls, cfg: PipelineConfig, run: RunDir, resume: Checkpoint | None) -> RunInputs:
        """For a run directory that already exists (a caller without a Session); the
        resolution log goes to its events."""
        root = checkpoint_root(cfg, run.path, resume)
        return cls.read(cfg, root, log=lambda m: run.event("log", message=m))


def reserve_placement(cfg: PipelineConfig) -> Placement:
    """The run's placement groups, placed; a group the cluster cannot hold within
    reliability.startup_timeout_s is a StageFailed naming it, never a hang."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("a run needs a connected Ray: run it in a driver.session.Session")
    timeout = cfg.reliability.startup_timeout_s
    placement = Placement(cfg.resources, grouped_actors(cfg), cfg.reliability.max_restarts)
    unplaced = placement.reserve(timeout)
    if unplaced:
        have = ray.cluster_resources()
        placement.release()
        raise StageFailed(
            "startup",
            f"placement groups not placed after {timeout:.0f} s: {unplaced}; "
            f"the cluster has {have}",
            "change resources.placement (strategy or groups), lower resources.*, or add nodes",
        )
    return placement


@dataclass(frozen=True)
class _Saving:
    """A checkpoint the learner is writing, and what the driver commits with it."""

    step: int
    staging: Path
    state: dict[str, Any]
    block_s: float
    t0: float
    background: bool


@dataclass
class RunWiring:
    """One run's placement groups, trackers and checkpoint root, and what is written
    through them (checkpoints, the profiler's spans, the exported student)."""

    cfg: PipelineConfig
    run: RunDir
    inputs: RunInputs
    trackers: Trackers
    placement: Placement
    saving: _Saving | None = None
    """The checkpoint being written, committed once complete (commit_written)."""
    block_s: float = 0.0
    """Seconds checkpoints blocked the learner, not yet reported (take_checkpoint_block)."""
    watch: NodeWatch | None = None
    """Ray's node table turned into the run's events (watch_nodes), until close()."""

    @classmethod
    def open(cls, cfg: PipelineConfig, run: RunDir, inputs: RunInputs) -> RunWiring:
        """Open the trackers (params logged once) and reserve the placement groups."""
        trackers = open_trackers(cfg, run)  # metrics.parquet + cfg.log.sinks
        try:
            placement = reserve_placement(cfg)
        except BaseException:
            trackers.close()
            raise
        return cls(cfg, run, inputs, trackers, placement)

    def check_checkpoint_root(self, learner: Any) -> None:
        """Refuse a checkpoint directory some learner worker cannot see (on another node,
        not shared storage): every rank must read the token the driver writes there."""
        import uuid

        import ray

        root, field = self.inputs.checkpoint_root, "reliability.checkpoint_dir"
        shown = f"{field} = {self.cfg.reliability.checkpoint_dir!r}" + (
            "" if self.cfg.reliability.checkpoint_dir else f" (the run directory's: {root})"
        )
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe, token = root / f".visible-{uuid.uuid4().hex}", uuid.uuid4().hex
            probe.write_text(token)
        except OSError as exc:
            raise ConfigError(f"{shown}: the driver cannot write there ({exc})") from exc
        try:
            ranks = ray.get(learner.sees.remote(str(probe), token))
        finally:
            probe.unlink(missing_ok=True)
        self.run.event(
            "learner_ranks", ranks=[{"rank": r["rank"], "node": r["node"]} for r in ranks]
        )
        blind = [r for r in ranks if not r["ok"]]
        if blind:
            raise ConfigError(
                f"{shown}: learner worker(s) "
                + ", ".join(f"rank {r['rank']} on node {r['node']}" for r in blind)
                + f" cannot see it (the driver runs on {ray.util.get_node_ip_address()}); "
                "every learner worker writes its checkpoint shards there: set it to storage "
                "that the driver's node and every learner node mount at the same path (NFS, "
                "Lustre, a mounted bucket), or place the learner on the driver's node"
            )

    def watch_nodes(self, actors: Callable[[], dict[str, Any]], pending: dict) -> NodeWatch:
        """Start recording where the stages run, nodes joining and lost, what a lost node
        held and what the run waits for (cluster/nodes.py); the controller sets its
        `step`. Stopped by close()."""
        self.watch = NodeWatch(self.run, actors, pending, self.cfg.resources).start()
        return self.watch

    def profiler(self, actors: dict[str, Any]) -> Profiler:
        """The run's profiler over `actors` (by the name their spans carry); its clock
        starts now."""
        return Profiler(self.run.path, actors, run_name=self.cfg.name)

    def checkpoint(
        self, learner: Any, state: dict[str, Any], step: int, get: Callable[[Any], Any]
    ) -> None:
        """The learner saves weights/optimizer/RNG of `step` into a staging dir, in the
        background (reliability.async_checkpoint): it returns once its state is copied, the
        seconds that blocked it kept for the step it delayed (`take_checkpoint_block`).
        `commit_written` commits it, with `state` (the loop's: dropped batches, the
        staleness policy's) and the number of metrics rows written so far, once complete.
        A previous save still being written is committed first. `get`: how to wait for a
        learner call (the healer's: a lost rank is a LearnerLost)."""
        self.commit_written(learner, get, wait=True)
        root, background = self.inputs.checkpoint_root, self.cfg.reliability.async_checkpoint
        staging = checkpoint.staging_dir(root, step)
        t0 = time.perf_counter()
        block_s = get(learner.save_checkpoint.remote(str(staging), background))
        state = {**state, "metrics_rows": len(self.run.metrics)}
        self.saving = _Saving(step, staging, state, block_s, t0, background)
        self.block_s += block_s
        if not background:
            self.commit_written(learner, get, wait=True)

    def commit_written(self, learner: Any, get: Callable[[Any], Any], wait: bool = False) -> None:
        """Commit the checkpoint being saved once every rank's part is written (wait: until
        then): rename into place, point `latest` at it, record a "checkpoint" event (its
        step, the seconds it blocked the learner, the seconds until written)."""
        saving = self.saving
        if saving is None or not get(learner.checkpoint_written.remote(wait)):
            return
        self.saving = None
        root, keep = self.inputs.checkpoint_root, self.cfg.reliability.keep_checkpoints
        checkpoint.commit(root, saving.staging, saving.step, saving.state, keep)
        self.run.event("checkpoint", step=saving.step, block_s=saving.block_s,
                       written_s=time.perf_counter() - saving.t0, background=saving.background)  # fmt: skip

    def abandon_checkpoint(self) -> None:
        """Forget a checkpoint still being written (its learner is gone): never committed."""
        if self.saving is not None:
            shutil.rmtree(self.saving.staging, ignore_errors=True)
            self.saving = None

    def take_checkpoint_block(self) -> float:
        """Seconds checkpoints blocked the learner since the last call (0 if none)."""
        block_s, self.block_s = self.block_s, 0.0
        return block_s

    def export_final(self, step: int) -> Path:
        """The finished run's student as a Hugging Face checkpoint in RUN_DIR/final/ (from
        the checkpoint of `step`, just written; export.py)."""
        from opdflow.record.export import export_checkpoint

        models, run = self.inputs.models, self.run
        out = export_checkpoint(
            self.inputs.checkpoint_root / f"step_{step:06d}", models.student, models.tokenizer,
            run.path / "final", overwrite=True,
        )  # fmt: skip
        run.event("export", step=step, path=str(out))
        return out

    def __enter__(self) -> RunWiring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the node watch, close the trackers and remove the placement groups."""
        if self.watch is not None:
            self.watch.stop()
        try:
            self.trackers.close()
        finally:
            self.placement.release()
