"""Precision recipes: the rollout engine's configuration c, named and serialisable.

A recipe changes only the rollout engine. `bf16` is the standard engine; `noise(sigma)`
perturbs every projection matrix by sigma * std(W) * N(0, 1), seeded, giving a
continuous mismatch knob. (Quantized recipes: see the recipes issue.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from opdflow.config import ConfigError

KNOWN = ("bf16", "noise")


@dataclass(frozen=True)
class Recipe:
    """A parsed recipe: its name and keyword arguments."""

    name: str
    args: tuple[tuple[str, Any], ...] = ()

    @property
    def text(self) -> str:
        if not self.args:
            return self.name
        return f"{self.name}(" + ", ".join(f"{k}={v!r}" for k, v in self.args) + ")"

    def arg(self, key: str, default: Any = None) -> Any:
        return dict(self.args).get(key, default)

    def prepare(self, model: Any) -> None:
        """One-time hooks on a freshly loaded engine model (none for bf16/noise)."""

    def transform_weights(self, model: Any) -> None:
        """Applied after every weight load (the learner's weights are BF16 and unperturbed)."""
        if self.name == "noise":
            import torch

            sigma = float(self.arg("sigma"))
            gen = torch.Generator().manual_seed(int(self.arg("seed", 0)))
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if p.ndim == 2 and "embed" not in name and "lm_head" not in name:
                        std = p.float().std()
                        p.add_((sigma * std * torch.randn(p.shape, generator=gen)).to(p.dtype))

    def make_cache(self, model_config: Any) -> Any | None:
        """A KV cache for one generate call, or None for the plain one."""
        return None


_CALL = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*(?:\((.*)\))?\s*$")


def parse_recipe(text: str) -> Recipe:
    """Parse "bf16" or "noise(0.15)" / "noise(sigma=0.15, seed=1)"."""
    m = _CALL.match(text or "")
    if not m:
        raise ConfigError(
            f"recipe {text!r} is malformed: expected NAME or NAME(args), e.g. noise(0.15)"
        )
    name, argtext = m.group(1), m.group(2)
    if name not in KNOWN:
        raise ConfigError(
            f"recipe {text!r}: unknown name {name!r}; known recipes: {', '.join(KNOWN)}"
        )
    args: dict[str, Any] = {}
    if argtext:
        for i, part in enumerate(p.strip() for p in argtext.split(",") if p.strip()):
            key, eq, val = part.partition("=")
            if not eq:
                key, val = ("sigma" if name == "noise" and i == 0 else f"arg{i}"), part
            try:
                args[key.strip()] = float(val) if "." in val or "e" in val else int(val)
            except ValueError as exc:
                raise ConfigError(f"recipe {text!r}: argument {part!r} is not a number") from exc
    if name == "noise" and "sigma" not in args:
        raise ConfigError(f"recipe {text!r}: noise needs sigma, e.g. noise(0.15)")
    return Recipe(name, tuple(sorted(args.items())))
