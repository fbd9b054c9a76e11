"""A run's lifecycle, written once: connect to Ray, create or resume the run directory, run,
clean up. `opdflow run`, `sweep`, `calibrate --short`, `study run` and the benches all train
through a Session; what a person sees of it is the commands' (console.py).

A Session holds one Ray connection for one or more runs. It connects when the first run is
about to train (RAY_ADDRESS, or a local cluster with at least the CPUs the largest run it
was told about holds) and shuts down only a cluster it started. Each `Session.run`:

1. reads what the run reads once (RunInputs.read: tracker settings, vLLM, models, prompts,
   the checkpoint directory) before anything is written or started: bad input leaves no
   run directory and starts no Ray;
2. creates the run directory; or resumes one from its latest checkpoint (`resume`: the
   config must match the run's); or, with `reuse`, returns a finished run of the same config
   as it is, resumes an unfinished one from its checkpoint and starts over one that stopped
   before its first checkpoint (a run of another config is refused, never overwritten);
3. trains it (controller.run_pipeline, with the inputs of step 1);
4. on failure removes a directory it created whose run trained no step, and keeps all else
   (metrics, checkpoints): nothing a resume could use is lost.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from opdflow.cluster.placement import cpu_need
from opdflow.config import PipelineConfig
from opdflow.driver.wiring import RunInputs, checkpoint_root
from opdflow.errors import ConfigError
from opdflow.record.checkpoint import Checkpoint, checkpoints_dir, load_latest
from opdflow.record.rundir import RunDir, check_new, default_path, same_config


@dataclass(frozen=True)
class Outcome:
    """A run a Session trained, or found finished."""

    run: RunDir
    summary: dict[str, Any]
    seconds: float
    """Wall seconds of the session that finished it, actor start-up included (events.jsonl,
    "finished"); NaN for a run finished before sessions recorded it."""
    reused: bool = False
    """The run had finished before (`reuse`): nothing was trained."""


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key} ({va!r} in the run, {vb!r} now)")
    return out


def open_resume(cfg: PipelineConfig, path: str | Path) -> tuple[RunDir, Checkpoint]:
    """The run directory and checkpoint to continue; the config must match the run's (its
    steps and learner workers aside: checkpoints reshard, any N resumes)."""
    run = RunDir.open(path)
    saved, now = run.config(), cfg.to_dict()
    for d in (saved, now):
        d.pop("run_dir", None)
        d["train"].pop("steps", None)
        d["resources"]["learner"].pop("workers", None)
    changed = _diff(saved, now)
    if changed:
        raise ConfigError(
            f"--resume {path}: the pipeline differs from the run's config.json in "
            + "; ".join(changed)
        )
    root = checkpoints_dir(run.path, cfg.reliability.checkpoint_dir)
    ckpt = load_latest(root)
    if ckpt is None:
        raise ConfigError(f"--resume {path}: no complete checkpoint in {root}; start a new run")
    return run, ckpt


def finished_run(cfg: PipelineConfig, path: Path) -> Outcome | None:
    """A finished run of this config in `path`, as it is; None when `path` holds no finished
    run. A finished run of another config is refused, never overwritten."""
    if not (path / "summary.json").is_file():
        return None
    if not same_config(path, cfg):
        raise ConfigError(
            f"{path} holds a finished run made with another config (different --set?); give "
            "another directory, or remove that one to redo it"
        )
    run = RunDir.open(path)
    ends = [e["seconds"] for e in run.events() if e.get("event") == "finished"]
    summary = json.loads((path / "summary.json").read_text())
    return Outcome(run, summary, ends[-1] if ends else math.nan, reused=True)


def unfinished_run(cfg: PipelineConfig, path: Path) -> Checkpoint | None:
    """The checkpoint an unfinished run of this config in `path` resumes from; None when
    `path` is empty or its run stopped before its first checkpoint (it starts over). A run
    of another config is refused, never overwritten."""
    if not path.is_dir() or not any(path.iterdir()):
        return None
    if not same_config(path, cfg):
        raise ConfigError(
            f"{path} holds an unfinished run of another config, or other files (different "
            "--set?); give another directory, or remove that one to redo it"
        )
    return load_latest(checkpoints_dir(path, cfg.reliability.checkpoint_dir))


def _silent(message: str) -> None:
    pass


class Watch(Protocol):
    """What a person is shown of a batch of runs (a sweep, the noise ladder): console.py's
    RunLines shows a status line while each trains and one line when it is done."""

    def running(
        self, label: str, cfg: PipelineConfig
    ) -> contextlib.AbstractContextManager[Callable[[dict], None]]:
        """While run `label` trains; the value is told each metrics row."""
        ...

    def done(self, label: str, outcome: Outcome) -> None:
        """Run `label` finished (or was found finished: outcome.reused)."""
        ...


class Unwatched:
    """A Watch that shows nothing (scripts, tests)."""

    @contextlib.contextmanager
    def running(self, label: str, cfg: PipelineConfig) -> Iterator[Callable[[dict], None]]:
        yield lambda row: None

    def done(self, label: str, outcome: Outcome) -> None:
        pass


class Session:
    """One Ray connection and the runs trained in it (a context manager: leaving it shuts
    down a cluster it started)."""

    def __init__(self, need_cpus: float = 0.0, log: Callable[[str], None] = _silent):
        self.need_cpus = need_cpus
        """Ray CPUs a local cluster starts with at least (cpu_need of the largest run)."""
        self.log = log
        """Where what happens before a run directory exists is told (tiny models built)."""
        self.connected = False
        self.started = False
        """This session started the local cluster it is connected to."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, cfg: PipelineConfig | None = None) -> None:
        """Connect to Ray once: RAY_ADDRESS, or a local cluster with at least the CPUs this
        session and `cfg` hold (cpu_need)."""
        if self.connected:
            return
        from opdflow.cluster.connection import connect

        need = max(self.need_cpus, cpu_need(cfg) if cfg is not None else 0.0)
        self.started = connect(need or None)
        self.connected = True

    def close(self) -> None:
        """Shut down the local cluster this session started (a joined one is left running)."""
        if self.started:
            import ray

            ray.shutdown()
        self.connected = self.started = False

    def run(
        self,
        cfg: PipelineConfig,
        path: str | Path | None = None,
        *,
        resume: str | Path | None = None,
        reuse: bool = False,
        on_open: Callable[[RunDir, Checkpoint | None], None] = lambda run, ckpt: None,
        on_step: Callable[[dict], None] = lambda row: None,
    ) -> Outcome:
        """Train one run in `path` (default: cfg.run_dir, else runs/NAME-TIME), or continue
        the run in `resume`; `on_open` sees the run directory (and the checkpoint it resumes
        from) before training starts, `on_step` every metrics row."""
        from opdflow.driver.controller import run_pipeline

        if resume is not None and path is not None:
            raise ConfigError("give either a new run directory or a run to resume, not both")
        where = Path(resume if resume is not None else path or default_path(cfg))
        run: RunDir | None = None
        ckpt: Checkpoint | None = None
        restart = False
        if resume is not None:
            run, ckpt = open_resume(cfg, where)
        elif reuse:
            if (done := finished_run(cfg, where)) is not None:
                return done
            ckpt = unfinished_run(cfg, where)
            restart = ckpt is None and where.is_dir() and any(where.iterdir())
        else:
            check_new(where)
        said: list[str] = []

        def log(message: str) -> None:
            said.append(message)
            self.log(message)

        inputs = RunInputs.read(cfg, checkpoint_root(cfg, where, ckpt), log)
        self.connect(cfg)
        if restart:  # a run of this config that stopped before its first checkpoint
            shutil.rmtree(where)
        if run is None:
            run = RunDir.open(where) if ckpt is not None else RunDir.create(cfg, where)
        for message in said:
            run.event("log", message=message)
        on_open(run, ckpt)
        t0 = time.perf_counter()
        try:
            summary = run_pipeline(cfg, run, on_step, resume=ckpt, inputs=inputs)
        except BaseException:
            if ckpt is None and not run.metrics:  # nothing trained: leave nothing half-written
                shutil.rmtree(run.path, ignore_errors=True)
            raise
        seconds = time.perf_counter() - t0
        run.event("finished", seconds=seconds)
        return Outcome(run, summary, seconds)

    def run_watched(
        self, watch: Watch, label: str, cfg: PipelineConfig, path: Path, reuse: bool = False
    ) -> Outcome:
        """`run` one of a batch of runs (a sweep, the noise ladder), shown by `watch` as
        `label` while it trains and once it is done."""
        with watch.running(label, cfg) as on_step:
            outcome = self.run(cfg, path, reuse=reuse, on_step=on_step)
        watch.done(label, outcome)
        return outcome
