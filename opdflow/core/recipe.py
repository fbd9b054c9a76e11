"""The recipe grammar: the rollout engine's configuration c, named, parsed and printed.

A recipe changes only the rollout engine. Its text is its serialised form:

    bf16                          the standard engine
    fp8                           linear layers' weights and inputs in FP8 E4M3, per-tensor
                                  scales: static weight scale (amax of the loaded weights),
                                  dynamic activation scale (amax of each input tensor)
    fp8_kv                        KV cache in E4M3, quantized on write; per-tensor scales
                                  amax / 448 of each generation's prefill
    fp8_kv(scale=unit)            scales 1.0: vLLM's own behaviour on a BF16 checkpoint
    fp8_kv(keys_only=true)        only keys (values_only=true: only values)
    nvfp4                         weights in NVFP4 (E2M1, blocks of 16, E4M3 block scales)
    nvfp4(activations=true)       weights and linear inputs in NVFP4
    noise(0.15)                   W += 0.15 * std(W) * N(0, 1) on every projection, seeded
    fp8(bf16_layers=[0,-1])       escape hatch: these decoder layers stay BF16
    fp8_kv(kv_bf16_layers=[0])    escape hatch: these layers' KV cache stays BF16
    fp8+fp8_kv                    parts compose left to right

Every part also takes `layers=[...]`: apply only to these decoder layers (attribution).
Negative layer indices count from the end. lm_head and embeddings are never quantized.
`fp8(impl=...)` picks NVIDIA Model Optimizer ("modelopt") or the pure-torch emulation
("torch"); "auto" (the default) takes Model Optimizer where it is installed.

This module only reads and writes recipes, so the config validates `engine.recipe` without
importing an engine. How each engine applies one is in opdflow/engines: quantize.py and
kvcache.py for TorchEngine, recipes.py for vLLM and Model Optimizer.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from opdflow.errors import ConfigError

# kind -> {argument: default}; an argument's type is its default's (None: a layer list)
_KINDS: dict[str, dict[str, Any]] = {
    "bf16": {},
    "fp8": {"layers": None, "bf16_layers": None, "impl": "auto"},
    "fp8_kv": {
        "layers": None,
        "kv_bf16_layers": None,
        "keys_only": False,
        "values_only": False,
        "scale": "amax",
    },
    "nvfp4": {"layers": None, "bf16_layers": None, "activations": False},
    "noise": {"sigma": None, "seed": 0, "layers": None, "bf16_layers": None},
}
KNOWN = tuple(_KINDS)
"""Every part name a recipe may use."""
_POSITIONAL = {"noise": "sigma"}
_KV_KINDS = ("fp8_kv",)
KV_SCALES = ("amax", "unit")
"""fp8_kv(scale=...): amax / 448 of the prefill (default), or 1.0 (vLLM's default)."""
IMPLS = ("auto", "modelopt", "torch")
"""fp8(impl=...): Model Optimizer where installed, Model Optimizer, or the torch emulation."""


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, str):
        return value
    return repr(value)


@dataclass(frozen=True)
class Part:
    """One component of a recipe: a kind and its non-default arguments."""

    name: str
    args: tuple[tuple[str, Any], ...] = ()

    @property
    def text(self) -> str:
        if not self.args:
            return self.name
        return f"{self.name}(" + ",".join(f"{k}={_fmt(v)}" for k, v in self.args) + ")"

    def arg(self, key: str) -> Any:
        """The argument's value, its default where not given, None where the kind has none."""
        return dict(self.args).get(key, _KINDS[self.name].get(key))

    def with_args(self, **changes: Any) -> Part:
        """A copy with arguments changed (None or the default removes one)."""
        args = dict(self.args)
        for key, value in changes.items():
            if key not in _KINDS[self.name]:
                raise ConfigError(f"recipe {self.text!r}: {self.name} has no argument {key!r}")
            if value is None or value == _KINDS[self.name][key]:
                args.pop(key, None)
            else:
                args[key] = tuple(value) if isinstance(value, list | tuple) else value
        return Part(self.name, tuple(sorted(args.items())))

    def layer_set(self, num_layers: int) -> set[int]:
        """Decoder layers this part acts on: `layers` (default all) minus its BF16 escapes."""
        chosen = self.arg("layers")
        escape = self.arg("kv_bf16_layers" if self.name in _KV_KINDS else "bf16_layers")
        out = set(range(num_layers)) if chosen is None else _normalise(chosen, num_layers, self)
        return out - (_normalise(escape, num_layers, self) if escape else set())


def _normalise(indices: tuple[int, ...], num_layers: int, part: Part) -> set[int]:
    out = set()
    for i in indices:
        if not -num_layers <= i < num_layers:
            raise ConfigError(
                f"recipe {part.text!r}: layer {i} out of range for a {num_layers}-layer model "
                f"(use 0..{num_layers - 1}, or -1 for the last)"
            )
        out.add(i % num_layers)
    return out


@dataclass(frozen=True)
class Recipe:
    """A parsed recipe: one or more parts applied left to right."""

    parts: tuple[Part, ...] = (Part("bf16"),)

    @property
    def text(self) -> str:
        return "+".join(p.text for p in self.parts)

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.parts)

    @property
    def kv_part(self) -> Part | None:
        """The part that quantizes the KV cache, or None."""
        return next((p for p in self.parts if p.name in _KV_KINDS), None)


_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$", re.S)
_LITERALS = {"true": True, "false": False, "True": True, "False": False}


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "+" and depth == 0 and not re.search(r"\d[eE]$", cur):
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur]


def _value(node: ast.AST, where: str) -> Any:
    if isinstance(node, ast.Name) and node.id in _LITERALS:
        return _LITERALS[node.id]
    if isinstance(node, ast.Name):
        return node.id  # a bare word, e.g. impl=torch
    try:
        value = ast.literal_eval(node)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot read value {ast.unparse(node)!r}") from exc
    return tuple(value) if isinstance(value, list | tuple) else value


def _check_arg(name: str, key: str, value: Any, where: str) -> Any:
    default = _KINDS[name][key]
    if key == "sigma":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
        return float(value) if ok else _bad(where, key, value, "a number >= 0")
    if default is None:  # a layer list
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value,)
        if isinstance(value, tuple) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return tuple(dict.fromkeys(value))  # deduplicated, order kept
        return _bad(where, key, value, "a list of layer indices, e.g. [0,-1]")
    if isinstance(default, bool):
        return value if isinstance(value, bool) else _bad(where, key, value, "true or false")
    if key == "impl":
        return value if value in IMPLS else _bad(where, key, value, " or ".join(IMPLS))
    if key == "scale":
        return value if value in KV_SCALES else _bad(where, key, value, " or ".join(KV_SCALES))
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _bad(where, key, value, "an integer")


def _bad(where: str, key: str, value: Any, expected: str):
    raise ConfigError(f"{where}: {key}={value!r} is not allowed; expected {expected}")


def _parse_part(text: str, whole: str) -> Part:
    where = f"recipe {whole!r}"
    m = _CALL.match(text)
    if not m:
        raise ConfigError(
            f"{where} is malformed at {text.strip()!r}: expected NAME or NAME(key=value, ...), "
            f"e.g. fp8(bf16_layers=[0,-1]); known recipes: {', '.join(KNOWN)}"
        )
    name, argtext = m.group(1), m.group(2)
    if name not in _KINDS:
        raise ConfigError(f"{where}: unknown recipe {name!r}; known recipes: {', '.join(KNOWN)}")
    args: dict[str, Any] = {}
    if argtext and argtext.strip():
        try:
            call = ast.parse(f"f({argtext})", mode="eval").body
        except SyntaxError as exc:
            raise ConfigError(f"{where}: cannot read arguments ({argtext}): {exc.msg}") from exc
        if len(call.args) > (1 if name in _POSITIONAL else 0):
            raise ConfigError(f"{where}: {name} takes key=value arguments only")
        pairs = [(_POSITIONAL.get(name), a) for a in call.args]
        pairs += [(kw.arg, kw.value) for kw in call.keywords]
        for key, node in pairs:
            if key not in _KINDS[name]:
                allowed = ", ".join(_KINDS[name]) or "none"
                raise ConfigError(f"{where}: {name} has no argument {key!r}; allowed: {allowed}")
            args[key] = _check_arg(name, key, _value(node, where), where)
    if name == "noise" and "sigma" not in args:
        raise ConfigError(f"{where}: noise needs sigma, e.g. noise(0.15)")
    if args.get("keys_only") and args.get("values_only"):
        raise ConfigError(f"{where}: keys_only and values_only exclude each other")
    part = Part(name)
    return part.with_args(**args) if args else part


def parse_recipe(text: str) -> Recipe:
    """Parse a recipe string ("bf16", "noise(0.15)", "fp8+fp8_kv(kv_bf16_layers=[0])")."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"recipe {text!r} is empty; known recipes: {', '.join(KNOWN)}")
    parts = tuple(_parse_part(t, text) for t in _split_top(text))
    if sum(p.name in _KV_KINDS for p in parts) > 1:
        raise ConfigError(f"recipe {text!r}: at most one KV-cache part")
    if len(parts) > 1:
        parts = tuple(p for p in parts if p.name != "bf16") or (Part("bf16"),)
    return Recipe(parts)


def with_parts(recipe: Recipe, **changes: Any) -> Recipe:
    """The recipe with every (non-bf16) part's arguments changed, e.g. layers=[1]."""
    out = []
    for part in recipe.parts:
        if part.name == "bf16":
            out.append(part)
            continue
        mine = {k: v for k, v in changes.items() if k in _KINDS[part.name]}
        if "bf16_layers" in changes and part.name in _KV_KINDS:
            mine["kv_bf16_layers"] = changes["bf16_layers"]
        out.append(part.with_args(**mine))
    return Recipe(tuple(out))
