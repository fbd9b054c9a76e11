"""A quantizing KV cache: transformers' DynamicCache whose chosen layers store E4M3 states.

Quantize on write, dequantize on read: each new key/value chunk is fake-quantized to FP8
E4M3 before it is appended, so attention (the prefill's included) always reads the
stored low-precision states, as on an FP8-KV engine. Scale: per tensor, one for keys and
one for values per layer, set from the amax of the first write (the prompt prefill) and
then frozen like a calibrated static scale; later writes beyond +-448 * scale saturate.
With `unit_scale` the scale is 1.0 throughout, as in vLLM's FP8 cache on a BF16 checkpoint
(values beyond +-448 saturate, below 2^-6 lose precision); recipes.py says which is which.
`make_cache` builds the cache a recipe's fp8_kv part asks for.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from opdflow.core.recipe import Recipe
from opdflow.engines.fakequant import fake_fp8, fp8_scale


class FP8WriteLayer(DynamicLayer):
    """A DynamicLayer that fake-quantizes keys and/or values to E4M3 as they are written."""

    def __init__(
        self, keys: bool = True, values: bool = True, unit_scale: bool = False, **kwargs: Any
    ):
        super().__init__(**kwargs)
        self.quantize_keys, self.quantize_values = keys, values
        unit = torch.tensor(1.0) if unit_scale else None
        self.key_scale: torch.Tensor | None = unit
        self.value_scale: torch.Tensor | None = unit

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.quantize_keys:
            if self.key_scale is None:
                self.key_scale = fp8_scale(key_states)
            key_states = fake_fp8(key_states, self.key_scale)
        if self.quantize_values:
            if self.value_scale is None:
                self.value_scale = fp8_scale(value_states)
            value_states = fake_fp8(value_states, self.value_scale)
        return super().update(key_states, value_states, *args, **kwargs)


def quantized_cache(
    model_config: Any,
    layers: set[int],
    keys: bool = True,
    values: bool = True,
    unit_scale: bool = False,
) -> DynamicCache:
    """A DynamicCache for `model_config` whose `layers` write E4M3 keys and/or values, scaled
    from the prefill's amax or (unit_scale) by 1.0."""
    cache = DynamicCache(config=model_config)
    for i in sorted(layers):
        if type(cache.layers[i]) is not DynamicLayer:
            raise NotImplementedError(
                f"fp8_kv: layer {i} uses {type(cache.layers[i]).__name__}; only full-attention "
                "DynamicLayer caches are quantized"
            )
        cache.layers[i] = FP8WriteLayer(keys=keys, values=values, unit_scale=unit_scale)
    return cache


def make_cache(recipe: Recipe, model_config: Any) -> DynamicCache | None:
    """The KV cache `recipe` asks for, for one generate call; None for the plain one."""
    part = recipe.kv_part
    if part is None:
        return None
    quantized = part.layer_set(model_config.num_hidden_layers)
    keys = not part.arg("values_only")
    values = not part.arg("keys_only")
    unit = part.arg("scale") == "unit"
    return quantized_cache(model_config, quantized, keys=keys, values=values, unit_scale=unit)
