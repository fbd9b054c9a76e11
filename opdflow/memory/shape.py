"""A model's shape: what the memory plan needs to know of a checkpoint without loading it.

`opdflow validate` checks config only, so the checkpoints may not be on this machine. The
shape is read from the checkpoint's config.json where the path exists locally; else, for a
student the shipped pipelines name (DeepSeek-R1-Distill-Qwen-7B and -1.5B), from their
published Qwen2 configs kept below; else the plan is refused, naming the field. The
plan traces a model built from this shape on fake tensors (trace.py), so the shape carries
the Hugging Face config itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opdflow.errors import ConfigError

KNOWN: dict[str, dict[str, Any]] = {
    "DeepSeek-R1-Distill-Qwen-7B": {
        "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "max_position_embeddings": 131072, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    },
    "DeepSeek-R1-Distill-Qwen-1.5B": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
        "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "max_position_embeddings": 131072, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    },
}  # fmt: skip
"""config.json fields of the students the shipped GPU pipelines name (their published
Qwen2 configs), for planning without the checkpoint on disk."""

ARCHS = ("qwen2", "llama")
"""Architectures whose parameter count and KV cache this module computes."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only causal LM (Qwen2 or Llama) that set its memory."""

    config: dict[str, Any] = field(repr=False)
    """The config.json fields (model_type, vocab_size, hidden_size, ...)."""
    source: str = ""
    """Where the shape came from, for the plan's output."""

    @property
    def arch(self) -> str:
        return str(self.config["model_type"])

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def vocab(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def hidden(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def heads(self) -> int:
        return int(self.config["num_attention_heads"])

    @property
    def kv_heads(self) -> int:
        return int(self.config.get("num_key_value_heads") or self.heads)

    @property
    def head_dim(self) -> int:
        return int(self.config.get("head_dim") or self.hidden // self.heads)

    @property
    def intermediate(self) -> int:
        return int(self.config["intermediate_size"])

    @property
    def tied(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", False))

    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention with Qwen2's q/k/v bias, MLP, norms)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = q + 2 * kv if self.arch == "qwen2" or self.config.get("attention_bias") else 0
        return h * (q + 2 * kv) + bias + q * h + 3 * h * self.intermediate + 2 * h

    def params(self) -> int:
        """All parameters: embeddings, decoder layers, final norm, head (unless tied)."""
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * self.layer_params() + self.hidden + head

    def kv_bytes_per_token(self, element_bytes: float, tp: int = 1) -> float:
        """KV cache bytes of one token on one of `tp` tensor-parallel shards (KV heads split
        over the shards, replicated where there are fewer heads than shards)."""
        heads = max(self.kv_heads // tp, 1)
        return 2 * self.layers * heads * self.head_dim * element_bytes

    def with_layers(self, layers: int) -> ModelShape:
        """The same model with `layers` decoder layers (the plan traces a few, then scales)."""
        per_layer = {  # e.g. layer_types: one entry per layer
            k: v[:layers]
            for k, v in self.config.items()
            if isinstance(v, list) and len(v) == self.layers
        }
        return replace(self, config={**self.config, **per_layer, "num_hidden_layers": layers})

    def hf_config(self) -> Any:
        """A transformers config of this shape (eager attention off: SDPA, as on a GPU)."""
        from transformers import AutoConfig

        fields = {k: v for k, v in self.config.items() if k != "model_type"}
        return AutoConfig.for_model(self.arch, **fields)


def model_shape(path: str, field_name: str) -> ModelShape:
    """The shape of the checkpoint at `path` (config field `field_name`, e.g. models.student):
    its config.json where it exists here, else a known student by its directory name, else
    a ConfigError that says how to give one."""
    config = Path(path) / "config.json"
    if config.is_file():
        try:
            data = json.loads(config.read_text())
        except ValueError as exc:
            raise ConfigError(f"{field_name} = {path!r}: {config} is not JSON ({exc})") from exc
        arch = data.get("model_type")
        if arch not in ARCHS:
            raise ConfigError(
                f"{field_name} = {path!r}: model_type {arch!r} in {config}; the memory plan "
                f"knows {', '.join(ARCHS)} (decoder-only causal LMs)"
            )
        return ModelShape(data, f"{config}")
    name = Path(path).name
    if name in KNOWN:
        return ModelShape(KNOWN[name], f"{name}'s published config (Qwen2), not read from disk")
    known = ", ".join(KNOWN)
    raise ConfigError(
        f"{field_name} = {path!r}: no config.json there and not a student whose shape the plan "
        f"knows ({known}); put the checkpoint (at least its config.json) at that path, or "
        f"--set {field_name}=DIR to a directory that has one"
    )
