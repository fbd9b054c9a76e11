"""Resolve and load the student, teacher and tokenizer from "tiny" or local checkpoints.

The same loading code serves the embedded tiny models and a user's real Hugging Face
checkpoint directory; problems are reported with the path and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opdflow.config import ConfigError, PipelineConfig


@dataclass(frozen=True)
class ResolvedModels:
    """Local paths of everything a run loads."""

    student: str
    teacher: str
    tokenizer: str
    train: str
    heldout: str


def _check_checkpoint(path: str, field: str) -> None:
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(
            f"{field} = {path!r}: directory not found (a local Hugging Face checkpoint, or 'tiny')"
        )
    if not (p / "config.json").is_file():
        raise ConfigError(
            f"{field} = {path!r}: no config.json in it; save the model with save_pretrained()"
        )
    try:
        from transformers import AutoConfig
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        config = AutoConfig.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"{field} = {path!r}: config.json cannot be read as a model config: {exc}"
        ) from exc
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(
            f"{field} = {path!r}: model_type {config.model_type!r} is not a causal language model "
            "architecture transformers can generate with (e.g. qwen2, llama)"
        )
    if not any(p.glob("*.safetensors")):
        raise ConfigError(
            f"{field} = {path!r}: no *.safetensors weights in it; opdflow loads safetensors only "
            "(re-save with save_pretrained(..., safe_serialization=True))"
        )


def _vocab(path: str) -> dict[str, int]:
    from opdflow.tokenizer import load_tokenizer

    return load_tokenizer(path).get_vocab()


def resolve_models(cfg: PipelineConfig, log=print) -> ResolvedModels:
    """Build or reuse the tiny models, or check the given checkpoint directories."""
    tiny = None
    if cfg.models.student == "tiny" or "tiny" in (cfg.data.train, cfg.data.heldout):
        from opdflow.zoo import ensure_tiny

        tiny = ensure_tiny(cfg.models.tiny, cfg.data.task, cfg.models.cache_dir, log=log)
    if cfg.models.student == "tiny":
        student, teacher, tokenizer = str(tiny.student), str(tiny.teacher), str(tiny.tokenizer)
    else:
        student, teacher = cfg.models.student, cfg.models.teacher
        _check_checkpoint(student, "models.student")
        _check_checkpoint(teacher, "models.teacher")
        tokenizer = student
        try:
            same = _vocab(student) == _vocab(teacher)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"models.student = {student!r}: cannot load its tokenizer: {exc}"
            ) from exc
        if not same:
            raise ConfigError(
                f"models.teacher = {teacher!r} has a different tokenizer vocabulary than models.student = "
                f"{student!r}; OPD scores the student's tokens with the teacher, so both must share one tokenizer"
            )
    train = str(tiny.train) if cfg.data.train == "tiny" else cfg.data.train
    heldout = str(tiny.heldout) if cfg.data.heldout == "tiny" else cfg.data.heldout
    return ResolvedModels(student, teacher, tokenizer, train, heldout)


def load_model(path: str, dtype: str = "bfloat16", device: str = "cpu"):
    """A causal LM in eval mode from a local directory."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), local_files_only=True
    )
    return model.to(device).eval()
