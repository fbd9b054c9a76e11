"""The distilled student out of a run: a Hugging Face checkpoint that transformers and vLLM load.

`opdflow export RUN_DIR [--step N] --out DIR` (and, at the end of every finished run,
RUN_DIR/final/) writes config.json (the student's, dtype bfloat16), the tokenizer, any
generation_config.json, and the learner's weights of that checkpoint in BF16 safetensors:
one model.safetensors, or shards of at most `max_shard_bytes` with
model.safetensors.index.json, as save_pretrained writes them. The learner's FP32 weights
are read from its sharded checkpoint (torch.distributed.checkpoint) a few tensors at a
time, `read_bytes` of FP32 at most, so a 7B model (28 GB in FP32) exports with about one
shard plus that in memory, never the whole model. Written into a temporary directory and
renamed: a crash leaves no half-written export.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from opdflow.errors import ConfigError

DEFAULT_SHARD_BYTES = 5 * 2**30
"""Largest safetensors file of an export (5 GiB): a 7B student in 3 BF16 shards."""
READ_BYTES = 2**30
"""FP32 bytes read from the checkpoint at once."""
PREFIX = "model."
"""Where the learner's weights are in its checkpoint (checkpoint.save_learner)."""


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB', '1000' -> bytes."""
    s = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(s[-1:], 1)
    try:
        value = float(s[:-1] if scale > 1 else s) * scale
    except ValueError:
        value = -1
    if value <= 0:
        raise ConfigError(f"--max-shard-size {text!r}: expected a size such as 5GB or 500MB")
    return int(value)


def find_checkpoint(run_dir: str | Path, step: int | None = None) -> tuple[Path, Any]:
    """The checkpoint directory of a run (`step`, default the latest) and the run's config;
    a ConfigError says what is missing."""
    from opdflow.config import PipelineConfig
    from opdflow.record.checkpoint import checkpoints_dir, load_latest

    run = Path(run_dir)
    if not (run / "config.json").is_file():
        raise ConfigError(
            f"{run} is not a run directory: no config.json in it (give the directory "
            "`opdflow run` wrote, e.g. runs/NAME-TIME)"
        )
    try:
        cfg = PipelineConfig.from_dict(json.loads((run / "config.json").read_text()))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{run}/config.json cannot be read as a pipeline config: {exc}") from exc
    root = checkpoints_dir(run, cfg.reliability.checkpoint_dir)
    steps = sorted(
        int(p.name.removeprefix("step_"))
        for p in root.glob("step_*")
        if p.is_dir() and (p / "state.json").is_file()
    )
    if not steps:
        where = "reliability.checkpoint_dir" if cfg.reliability.checkpoint_dir else "the run"
        raise ConfigError(
            f"{run} has no checkpoint to export: no complete step_NNNNNN directory in {root} "
            f"({where}'s checkpoint directory{'' if root.is_dir() else ', which does not exist'});"
            " a run writes one every reliability.checkpoint_every steps and when it ends"
        )
    if step is None:
        latest = load_latest(root)
        return (latest.path if latest else root / f"step_{steps[-1]:06d}"), cfg
    if step not in steps:
        raise ConfigError(
            f"{run}: no checkpoint of step {step} in {root}; there are: "
            + ", ".join(str(s) for s in steps)
        )
    return root / f"step_{step:06d}", cfg


def _plan(keys: list[tuple[str, int]], limit: int) -> list[list[str]]:
    """Consecutive groups of (key, bytes) of at most `limit` bytes (a larger tensor alone)."""
    groups: list[list[str]] = [[]]
    size = 0
    for key, nbytes in keys:
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += nbytes
    return [g for g in groups if g]


def export_checkpoint(
    ckpt_dir: str | Path,
    student_path: str | Path,
    tokenizer_path: str | Path,
    out: str | Path,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    read_bytes: int = READ_BYTES,
    overwrite: bool = False,
) -> Path:
    """Write the learner's weights in `ckpt_dir` as a BF16 Hugging Face checkpoint in `out`
    with the student's config and the tokenizer. Returns `out`."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from transformers import AutoConfig

    from opdflow.inputs.models import load_tokenizer
    from opdflow.record.checkpoint import single_process_quiet

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out} exists and is not empty; choose a new directory")
    config = AutoConfig.from_pretrained(str(student_path), local_files_only=True)
    meta = dcp.FileSystemReader(str(ckpt_dir)).read_metadata().state_dict_metadata
    items = {
        k.removeprefix(PREFIX): v
        for k, v in meta.items()
        if k.startswith(PREFIX) and isinstance(v, TensorStorageMetadata)
    }
    if not items:
        raise ConfigError(f"{ckpt_dir}: the checkpoint holds no learner weights ({PREFIX}*)")
    if getattr(config, "tie_word_embeddings", False):
        items.pop("lm_head.weight", None)  # tied to the embedding: save_pretrained drops it too

    def out_bytes(v: Any) -> int:
        elems = int(torch.Size(v.size).numel())
        return elems * (2 if v.properties.dtype.is_floating_point else v.properties.dtype.itemsize)

    keys = [(k, out_bytes(v)) for k, v in items.items()]
    shards = _plan(keys, max_shard_bytes)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    for name, shard in zip(names, shards):
        tensors: dict[str, Any] = {}
        sizes = [(k, 4 * int(torch.Size(items[k].size).numel())) for k in shard]
        for part in _plan(sizes, read_bytes):  # FP32 read a few tensors at a time
            flat = {
                PREFIX + k: torch.empty(tuple(items[k].size), dtype=items[k].properties.dtype)
                for k in part
            }
            with single_process_quiet():
                dcp.load(flat, checkpoint_id=str(ckpt_dir), no_dist=True)
            for k in part:
                t = flat.pop(PREFIX + k)
                tensors[k] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
        save_file(tensors, str(tmp / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        del tensors
    if len(names) > 1:
        total = sum(nbytes for _, nbytes in keys)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.dtype = "bfloat16"
    config.save_pretrained(str(tmp))
    if (Path(student_path) / "generation_config.json").is_file():
        shutil.copy(Path(student_path) / "generation_config.json", tmp)
    load_tokenizer(tokenizer_path).save_pretrained(str(tmp))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def student_paths(cfg: Any) -> tuple[str, str]:
    """(student checkpoint, tokenizer) directories of a run's config: the local checkpoint,
    or the cached tiny build (built again if the cache was cleared; nothing downloaded)."""
    if cfg.models.student != "tiny":
        return cfg.models.student, cfg.models.student
    from opdflow.testbed.zoo import ensure_tiny

    tiny = ensure_tiny(cfg.models.tiny, cfg.data.task, cfg.models.cache_dir, log=lambda m: None)
    return str(tiny.student), str(tiny.tokenizer)


def export_run(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """`opdflow export`: a run's checkpoint (`step`, default the latest) as a Hugging Face
    checkpoint in `out`."""
    ckpt, cfg = find_checkpoint(run_dir, step)
    student, tokenizer = student_paths(cfg)
    if not Path(student, "config.json").is_file():
        raise ConfigError(
            f"models.student = {student!r} of {run_dir} has no config.json any more: the "
            "export takes the architecture and tokenizer from there; restore it"
        )
    return export_checkpoint(ckpt, student, tokenizer, out, max_shard_bytes)
