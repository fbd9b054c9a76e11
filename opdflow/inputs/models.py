"""Resolve and load the student, teacher and tokenizer from "tiny" or local checkpoints.

The same loading code serves the embedded tiny models and a user's real Hugging Face
checkpoint directory; problems are reported with the path and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from opdflow.config import PipelineConfig
from opdflow.errors import ConfigError


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
    heads = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    for arch in config.architectures or []:  # none given: AutoModelForCausalLM goes by model_type
        if arch not in heads and not arch.endswith("ForCausalLM"):
            causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]
            raise ConfigError(
                f"{field} = {path!r}: config.json architectures {arch!r} (model_type "
                f"{config.model_type!r}) is not a causal language model head; save a causal LM "
                f"(e.g. {causal}, via AutoModelForCausalLM.save_pretrained)"
            )
    _check_weights(p, field, path)


def _check_weights(p: Path, field: str, path: str) -> None:
    """Every safetensors file's header parses and covers the file (reads headers, not weights)."""
    from safetensors import SafetensorError, safe_open

    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise ConfigError(
            f"{field} = {path!r}: no *.safetensors weights in it; opdflow loads safetensors only "
            "(re-save with save_pretrained(..., safe_serialization=True))"
        )
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, AttributeError) as exc:
            raise ConfigError(
                f"{field} = {path!r}: {index.name} is not a safetensors index ({exc}); "
                "re-save the model with save_pretrained()"
            ) from exc
        missing = sorted(s for s in shards if not (p / s).is_file())
        if missing:
            raise ConfigError(
                f"{field} = {path!r}: {index.name} lists {', '.join(missing)} but it is not in "
                "the directory; copy the missing shard(s) or re-save with save_pretrained()"
            )
    for f in files:
        try:
            with safe_open(str(f), framework="numpy") as st:
                st.keys()
        except (SafetensorError, OSError) as exc:
            raise ConfigError(
                f"{field} = {path!r}: {f} is not a readable safetensors file ({exc}; "
                f"{f.stat().st_size} bytes); it is truncated or corrupt: copy or save it again"
            ) from exc


def check_checkpoints(cfg: PipelineConfig) -> None:
    """Refuse a bad local student/teacher checkpoint (resolve_models does, before it builds
    anything). Cheap: reads config.json and the safetensors headers only."""
    if cfg.models.student != "tiny":
        _check_checkpoint(cfg.models.student, "models.student")
    if cfg.models.teacher != "tiny":
        _check_checkpoint(cfg.models.teacher, "models.teacher")


def _vocab(path: str) -> dict[str, int]:

    return load_tokenizer(path).get_vocab()


def resolve_models(cfg: PipelineConfig, log=print) -> ResolvedModels:
    """Check the given checkpoint directories, then build or reuse the tiny models."""
    check_checkpoints(cfg)
    tiny = None
    if cfg.models.student == "tiny" or "tiny" in (cfg.data.train, cfg.data.heldout):
        from opdflow.testbed.zoo import ensure_tiny

        tiny = ensure_tiny(cfg.models.tiny, cfg.data.task, cfg.models.cache_dir, log=log)
    if cfg.models.student == "tiny":
        student, teacher, tokenizer = str(tiny.student), str(tiny.teacher), str(tiny.tokenizer)
    else:
        student, teacher = cfg.models.student, cfg.models.teacher
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


BF16_COMPUTE_ENV = "OPDFLOW_BF16_COMPUTE"
"""Override of where BF16 stages compute: "auto" (default), "bfloat16" or "float32"."""


def native_bf16(device: str = "cpu") -> bool:
    """Whether this device multiplies bfloat16 natively (CUDA with bf16, CPUs with AVX512/AMX).

    Without it (e.g. AVX2-only CPUs) torch emulates bf16 matmuls, tens of times slower than
    float32, so BF16 stages there compute in float32 on bf16-rounded weights."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def bf16_compute_dtype(device: str = "cpu"):
    """The dtype "bfloat16" stages compute in: bfloat16 where native, else float32.

    Either way their weights are rounded to bfloat16, so a "bf16" model holds the same values
    everywhere; only activations (and the KV cache) are wider on CPUs without native bf16.
    $OPDFLOW_BF16_COMPUTE=bfloat16|float32 forces one."""
    import os

    import torch

    choice = os.environ.get(BF16_COMPUTE_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "bfloat16", "float32"):
        raise ConfigError(
            f"${BF16_COMPUTE_ENV} = {choice!r} is not allowed: expected auto, bfloat16 or float32"
        )
    if choice == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    return getattr(torch, choice)


def load_model(path: str, dtype: str = "bfloat16", device: str = "cpu"):
    """A causal LM in eval mode from a local directory.

    dtype "bfloat16" means BF16 weights computed in bf16_compute_dtype(device); "float32" is
    plain float32 (the learner's master weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), local_files_only=True
    )
    if dtype == "bfloat16":
        model = model.to(bf16_compute_dtype(device))  # exact: bf16 values fit in float32
    return model.to(device).eval()


def load_tokenizer(path: str | Path):
    """AutoTokenizer from a local directory, left padding, a pad token guaranteed."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
