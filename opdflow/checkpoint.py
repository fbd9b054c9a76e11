"""Checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint is a directory run/checkpoints/step_NNNNNN holding the learner's weights and
optimizer state (safetensors: no pickle), its RNG state, and state.json (step, staleness
policy state, counters). It is written into a temporary directory and renamed into place,
then `checkpoints/latest` is replaced atomically: a crash mid-write leaves the previous
checkpoint usable. Data cursors need no saving: prompts are a pure function of the step.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]


def checkpoints_dir(run_path: Path) -> Path:
    return Path(run_path) / "checkpoints"


def staging_dir(run_path: Path, step: int) -> Path:
    """Where the learner and the driver write a checkpoint before it is committed."""
    d = checkpoints_dir(run_path) / f".step_{step:06d}.tmp"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def commit(run_path: Path, staging: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Finish a staged checkpoint: write state.json, rename into place, point `latest` at it."""
    (staging / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    final = checkpoints_dir(run_path) / f"step_{step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    latest_tmp = checkpoints_dir(run_path) / ".latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, checkpoints_dir(run_path) / "latest")
    done = sorted(p for p in checkpoints_dir(run_path).glob("step_*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest(run_path: Path) -> Checkpoint | None:
    """The newest complete checkpoint of a run, or None."""
    latest = checkpoints_dir(run_path) / "latest"
    if not latest.is_file():
        return None
    path = checkpoints_dir(run_path) / latest.read_text().strip()
    state_file = path / "state.json"
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    return Checkpoint(path, int(state["step"]), state)


def save_learner(model: Any, optimizer: Any, out_dir: Path) -> None:
    """Weights, optimizer tensors and torch RNG as safetensors; optimizer scalars as JSON."""
    save_learner_state(model.state_dict(), optimizer.state_dict(), out_dir)


def save_learner_state(
    model_state: dict[str, Any], optimizer_state: dict[str, Any], out_dir: Path
) -> None:
    """save_learner from full (unsharded) state dicts: the model's, and the optimizer's in
    torch's own layout (parameters numbered in model.parameters() order)."""
    import torch
    from safetensors.torch import save_file

    save_file(
        {k: v.detach().contiguous() for k, v in model_state.items()},
        out_dir / "model.safetensors",
    )
    tensors: dict[str, torch.Tensor] = {"rng": torch.get_rng_state()}
    scalars: dict[str, Any] = {"param_groups": optimizer_state["param_groups"], "state": {}}
    for idx, st in optimizer_state["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"{idx}.{key}"] = value.detach().contiguous()
            else:
                scalars["state"].setdefault(str(idx), {})[key] = value
    save_file(tensors, out_dir / "optimizer.safetensors")
    (out_dir / "optimizer.json").write_text(json.dumps(scalars))


def load_learner(model: Any, optimizer: Any, ckpt_dir: Path) -> None:
    """Restore what save_learner wrote (exactly: FP32 weights and optimizer moments)."""
    import torch

    model_state, optimizer_state, rng = read_learner_state(ckpt_dir)
    model.load_state_dict(model_state, strict=True)
    optimizer.load_state_dict(optimizer_state)
    torch.set_rng_state(rng)


def read_learner_state(ckpt_dir: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """What save_learner wrote: (model state, optimizer state in torch's layout, RNG state)."""
    from safetensors.torch import load_file

    model_state = load_file(ckpt_dir / "model.safetensors")
    tensors = load_file(ckpt_dir / "optimizer.safetensors")
    scalars = json.loads((ckpt_dir / "optimizer.json").read_text())
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name == "rng":
            continue
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    for idx, extra in scalars["state"].items():
        state.setdefault(int(idx), {}).update(extra)
    return model_state, {"state": state, "param_groups": scalars["param_groups"]}, tensors["rng"]
