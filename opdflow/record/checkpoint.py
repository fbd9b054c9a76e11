"""Checkpoints: everything needed to continue a run exactly, written atomically, sharded.

A checkpoint is a directory step_NNNNNN under the run's checkpoint root
(`reliability.checkpoint_dir`, default run/checkpoints). The learner's weights, AdamW state
and random state (the CPU generator's and, on a GPU, the CUDA generators', so a resumed
GPU run samples as the uninterrupted one) are written with torch.distributed.checkpoint
(DCP): every learner rank writes only its own shards, in parallel, and a load reshards
them onto any number of ranks, so a run checkpointed with N workers resumes with M.
learner.json holds the learner's counters and state.json the driver's (step, staleness
policy state, counters). Everything is written into a temporary directory that the driver
renames into place, then `latest` is replaced atomically: a crash mid-write leaves the previous checkpoint usable. The learner's part is
written in the background (DCP's asynchronous save: the step waits only for a copy of the
state in host memory) and the driver commits it only once every rank's part is complete,
so a resume, or a rewind of a learner that heals, only ever sees committed checkpoints.
Data cursors need no saving: prompts are a pure function of the step.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]


def checkpoints_dir(run_path: Path, checkpoint_dir: str | None = None) -> Path:
    """A run's checkpoint root: `checkpoint_dir` (reliability.checkpoint_dir) if set, else
    <run_path>/checkpoints."""
    return Path(checkpoint_dir) if checkpoint_dir else Path(run_path) / "checkpoints"


def staging_dir(root: Path, step: int) -> Path:
    """Where the learner and the driver write a checkpoint before it is committed."""
    d = Path(root) / f".step_{step:06d}.tmp"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def commit(root: Path, staging: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Finish a staged checkpoint: write state.json, rename into place, point `latest` at it."""
    root = Path(root)
    (staging / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    final = root / f"step_{step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest(root: Path) -> Checkpoint | None:
    """The newest complete checkpoint under a checkpoint root, or None."""
    latest = Path(root) / "latest"
    if not latest.is_file():
        return None
    path = Path(root) / latest.read_text().strip()
    state_file = path / "state.json"
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    return Checkpoint(path, int(state["step"]), state)


def save_learner(
    model: Any, optimizer: Any, out_dir: Path, background: bool = False, group: Any = None
) -> Future | None:
    """The learner's weights, AdamW state and RNG as DCP shards in `out_dir`; every rank of a
    data-parallel learner calls it (each writes its own shards, rank 0 the metadata).

    background: DCP's asynchronous save. It returns once the state is copied (staged) into
    host memory of its own, so the caller may train on; the files are written in a thread,
    and the returned future is done once this rank's part is (on rank 0, the coordinator:
    once the whole checkpoint is, metadata included). Its collectives go over `group`, a
    gloo group of their own beside the training's (None: no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, **rng_state(_device(model))}
    with single_process_quiet():
        if background:
            return dcp.async_save(
                state, checkpoint_id=str(out_dir), process_group=group, no_dist=not _distributed()
            )
        dcp.save(state, checkpoint_id=str(out_dir), no_dist=not _distributed())
    return None


class LearnerSaves:
    """One learner rank's checkpoint saves (save_learner), one at a time: the one being
    written in the background, and the gloo group background saves coordinate over."""

    def __init__(self) -> None:
        self.saving: Future | None = None
        self.group: Any = None

    def start(self, model: Any, optimizer: Any, out_dir: Path, background: bool) -> None:
        """Save (after the previous save is written); background: return once staged."""
        self.wait()
        group = self._group() if background else None
        if background and not _distributed():  # DCP warns from the save's thread, later
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        self.saving = save_learner(model, optimizer, out_dir, background, group)

    def done(self) -> bool:
        """Whether the last save is completely written (raises if it failed)."""
        return self.saving is None or (self.saving.done() and self.wait())

    def wait(self) -> bool:
        """Until the last save is completely written (raises if it failed); True."""
        saving, self.saving = self.saving, None
        if saving is not None:
            saving.result()
        return True

    def _group(self) -> Any:
        """A gloo group of the learner's ranks for background saves (None without a process
        group): their collectives run in the save's thread, beside the training thread's
        on the main group, and a main group of NCCL cannot carry them."""
        if self.group is None and _distributed():
            import torch.distributed as dist

            self.group = dist.new_group(backend="gloo")  # every rank at its first save
        return self.group


def load_learner(model: Any, optimizer: Any, ckpt_dir: Path) -> str:
    """Restore what save_learner wrote, resharded onto this learner's ranks (any number);
    returns what happened to the CUDA random state (cuda_rng_action)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / ".metadata").is_file():
        old = (ckpt_dir / "model.safetensors").is_file()
        raise RuntimeError(
            f"{ckpt_dir} is not a sharded checkpoint (no .metadata)"
            + (
                ": it is the single-file format of opdflow before sharded checkpoints, which "
                "this version cannot resume; start a new run"
                if old
                else "; it is incomplete or not a checkpoint"
            )
        )
    model_state, optim_state = get_state_dict(model, optimizer)  # fresh AdamW: zero moments
    device = _device(model)
    state = {"model": model_state, "optim": optim_state, "rng": torch.get_rng_state()}
    saved = dcp.FileSystemReader(str(ckpt_dir)).read_metadata().state_dict_metadata
    action = cuda_rng_action(CUDA_RNG in saved, device.type)
    if action == "restore":  # else the CUDA rows are not read
        state[CUDA_RNG] = torch.empty(tuple(saved[CUDA_RNG].size), dtype=torch.uint8)
    with single_process_quiet():
        dcp.load(state, checkpoint_id=str(ckpt_dir), no_dist=not _distributed())
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    restore_rng(state, device)
    return action


CUDA_RNG = "rng_cuda"
"""A checkpoint's key of the CUDA random state: one row per GPU the learner saw."""


def rng_state(device: Any) -> dict[str, Any]:
    """The random state a checkpoint keeps: the CPU generator's ("rng") and, for a learner
    on a GPU, every visible GPU's generator (CUDA_RNG, stacked; a Ray actor sees its one)."""
    import torch

    state = {"rng": torch.get_rng_state()}
    if device.type == "cuda":
        state[CUDA_RNG] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def cuda_rng_action(saved: bool, device_type: str) -> str:
    """What a resume does with the CUDA random state, by whether the checkpoint holds one
    and where the learner now computes: "restore" (held, GPU learner: it continues as the
    uninterrupted run), "drop" (held, CPU learner: nothing to restore it into), "seeded"
    (none held, a run saved on a CPU: the GPU keeps the learner's seed), "none" (neither)."""
    if device_type == "cuda":
        return "restore" if saved else "seeded"
    return "drop" if saved else "none"


def restore_rng(state: dict[str, Any], device: Any) -> None:
    """Set the generators from a loaded rng_state: the CPU's, and the CUDA rows where the
    state has them and the learner is on a GPU (each GPU its own row where as many are
    visible as were saved, else the learner's GPU the first row)."""
    import torch

    torch.set_rng_state(state["rng"])
    if cuda_rng_action(CUDA_RNG in state, device.type) == "restore":
        rows = list(state[CUDA_RNG])
        if len(rows) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(rows)
        else:
            torch.cuda.set_rng_state(rows[0], device)


def _device(model: Any) -> Any:
    """Where the learner's parameters (their local shards) live."""
    return next(model.parameters()).device


@contextlib.contextmanager
def single_process_quiet() -> Iterator[None]:
    """DCP warns on every single-process save/load (a one-worker learner, a reader): that is
    the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _distributed() -> bool:
    """Whether this process is in a torch.distributed group (a sharded learner)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def read_state(ckpt_dir: Path, prefix: str = "model.") -> dict[str, Any]:
    """Full CPU tensors of a checkpoint whose names start with `prefix`, the prefix dropped,
    read in this one process (no learner, no process group): "model." gives the learner's
    FP32 weights by parameter name, "optim.state." its AdamW moments, for analysis and export."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(str(ckpt_dir)).read_metadata()
    flat = {
        key: torch.empty(tuple(item.size), dtype=item.properties.dtype)
        for key, item in meta.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(item, TensorStorageMetadata)
    }
    with single_process_quiet():
        dcp.load(flat, checkpoint_id=str(ckpt_dir), no_dist=True)
    return {key.removeprefix(prefix): value for key, value in flat.items()}
