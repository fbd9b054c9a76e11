"""`--set a.b=value`: any config field overridden from the command line, typed by its annotation."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from opdflow.config.pipeline import PipelineConfig
from opdflow.config.rules import fail, type_name, unknown_field
from opdflow.errors import ConfigError


def _coerce(text: str, hint: Any, path: str) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null"):
            return None
        hint = args[0]
    try:
        if hint is bool:
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if hint is int:
            return int(text)
        if hint is float:
            return float(text)
        if typing.get_origin(hint) in (dict, list):
            return json.loads(text)
        return text
    except ValueError:
        fail(path, text, f"a value of type {type_name(hint)}")


def apply_overrides(cfg: PipelineConfig, overrides: list[str]) -> PipelineConfig:
    """Apply `a.b=value` strings (the CLI's --set) in place, then validate."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE, e.g. --set train.lr=3e-4")
        key, text = item.split("=", 1)
        obj: Any = cfg
        parts = key.strip().split(".")
        for i, part in enumerate(parts):
            prefix = ".".join(parts[:i])
            prefix = prefix + "." if prefix else ""
            if not dataclasses.is_dataclass(obj) or part not in {
                f.name for f in dataclasses.fields(obj)
            }:
                if not dataclasses.is_dataclass(obj):
                    raise ConfigError(f"--set {key}: {prefix.rstrip('.')} has no sub-fields")
                unknown_field(prefix, part, type(obj))
            if i == len(parts) - 1:
                hint = typing.get_type_hints(type(obj))[part]
                if dataclasses.is_dataclass(hint):
                    raise ConfigError(
                        f"--set {key}: a section; set one of its fields, e.g. {key}.<field>=..."
                    )
                setattr(obj, part, _coerce(text.strip(), hint, key))
            else:
                obj = getattr(obj, part)
    return cfg.validate()
