"""Validation rules every config section uses, with errors that name the field.

Each rule raises ConfigError("PATH = VALUE is not allowed: expected ..."), suggesting the
closest allowed name where there is one. `check_types` walks a whole config and checks
every field against its annotation.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from opdflow.errors import ConfigError


def fail(path: str, value: Any, expected: str) -> typing.NoReturn:
    """Refuse `value` at `path`, saying what is expected."""
    raise ConfigError(f"{path} = {value!r} is not allowed: expected {expected}")


def one_of(path: str, value: Any, allowed: tuple[str, ...]) -> None:
    """`value` is one of `allowed`; else the refusal suggests the closest."""
    if value not in allowed:
        hint = difflib.get_close_matches(str(value), allowed, n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        fail(path, value, "one of " + ", ".join(repr(a) for a in allowed) + extra)


def positive(path: str, value: Any) -> None:
    """`value` is a number > 0 (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        fail(path, value, "a number > 0")


def nonnegative(path: str, value: Any) -> None:
    """`value` is a number >= 0 (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        fail(path, value, "a number >= 0")


def in_range(path: str, value: Any, lo: int, hi: int) -> None:
    """`value` is an integer in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        fail(path, value, f"an integer in [{lo}, {hi}]")


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is dict:
        return isinstance(value, dict)
    if origin is list:
        return isinstance(value, list)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def check_types(obj: Any, prefix: str) -> None:
    """Every field of the dataclass `obj`, nested ones too, matches its annotation."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_types(value, path + ".")
        elif not _type_ok(value, hints[f.name]):
            fail(path, value, f"a value of type {type_name(hints[f.name])}")


def type_name(hint: Any) -> str:
    """An annotation as a person reads it: int, str | None, list[str]."""
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def unknown_field(path: str, name: str, cls: type) -> typing.NoReturn:
    """Refuse field `name` that `cls` lacks, suggesting the closest and listing them all."""
    names = [f.name for f in dataclasses.fields(cls)]
    hint = difflib.get_close_matches(name, names, n=1)
    extra = f"; did you mean {hint[0]!r}?" if hint else ""
    raise ConfigError(
        f"unknown config field {path + name!r}{extra} (fields of {cls.__name__}: {', '.join(names)})"
    )
