"""Applying a recipe to a transformers model: weight transforms and linear-input hooks.

TorchEngine calls `prepare` once on a freshly loaded model and `transform_weights` after
every weight load (it reloads BF16 weights, then re-applies the transform, in place); the
KV-cache part is kvcache.py's. Activations are fake-quantized by forward pre-hooks on the
linear layers of the chosen decoder layers. `fp8` prefers NVIDIA Model Optimizer
(quantizers inserted into the model, weight amax recomputed per forward so reloads need
no recalibration, input amax dynamic per tensor) and falls back to the torch emulation.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from opdflow.core.recipe import Part, Recipe
from opdflow.engines.fakequant import fake_fp8, fake_nvfp4
from opdflow.engines.recipes import modelopt_quant_cfg
from opdflow.errors import ConfigError

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def num_layers(model: torch.nn.Module) -> int:
    return int(model.config.num_hidden_layers)


def decoder_linears(model: torch.nn.Module, layers: set[int]) -> list[tuple[str, torch.nn.Module]]:
    """Linear modules inside the chosen decoder layers (never lm_head or embeddings)."""
    out = []
    for name, module in model.named_modules():
        m = _LAYER.search(name)
        if m and int(m.group(1)) in layers and isinstance(module, torch.nn.Linear):
            out.append((name, module))
    return out


def modelopt_available() -> bool:
    import warnings

    try:
        with warnings.catch_warnings():  # 0.47 warns that transformers 5.24 is untested
            warnings.simplefilter("ignore", UserWarning)
            import modelopt.torch.quantization  # noqa: F401
    except Exception:  # any import failure means "use the emulation"
        return False
    return True


def fp8_impl(part: Part) -> str:
    impl = part.arg("impl")
    if impl == "auto":
        return "modelopt" if modelopt_available() else "torch"
    if impl == "modelopt" and not modelopt_available():
        raise ConfigError(
            f"recipe {part.text!r}: impl=modelopt needs nvidia-modelopt "
            "(pip install nvidia-modelopt), or use impl=torch"
        )
    return impl


def _input_hook(fn):
    def hook(module, args, kwargs):
        if args:
            return (fn(args[0]), *args[1:]), kwargs
        return args, kwargs

    return hook


def _prepare_modelopt_fp8(part: Part, model: torch.nn.Module) -> None:
    import contextlib
    import io

    import modelopt.torch.quantization as mtq

    cfg = modelopt_quant_cfg(Recipe((part.with_args(impl=None),)), num_layers(model))
    with contextlib.redirect_stdout(io.StringIO()):
        mtq.quantize(model, cfg, forward_loop=None)  # weights calibrated, inputs dynamic
    for module in model.modules():
        q = getattr(module, "weight_quantizer", None)
        if q is not None and q.is_enabled:
            q.reset_amax()  # amax from the current weights at every forward: reloads just work


def prepare(recipe: Recipe, model: torch.nn.Module) -> None:
    """One-time hooks on a freshly loaded engine model (quantizers, input hooks)."""
    for part in recipe.parts:
        _prepare_part(part, model)


@torch.no_grad()
def transform_weights(recipe: Recipe, model: torch.nn.Module) -> None:
    """Applied after every weight load (the learner's weights are BF16 and unperturbed)."""
    for part in recipe.parts:
        _transform_part(part, model)


def _prepare_part(part: Part, model: torch.nn.Module) -> None:
    """One-time hooks for `part` on a freshly loaded model."""
    chosen = part.layer_set(num_layers(model))
    if part.name == "fp8":
        if not chosen:
            return
        if fp8_impl(part) == "modelopt":
            _prepare_modelopt_fp8(part, model)
            return
        for _, lin in decoder_linears(model, chosen):
            lin.register_forward_pre_hook(_input_hook(fake_fp8), with_kwargs=True)
    elif part.name == "nvfp4" and part.arg("activations"):
        for _, lin in decoder_linears(model, chosen):
            lin.register_forward_pre_hook(_input_hook(fake_nvfp4), with_kwargs=True)


def _transform_part(part: Part, model: torch.nn.Module) -> None:
    """Re-applied after every weight load: fake-quantize or perturb the chosen weights."""
    chosen = part.layer_set(num_layers(model))
    if part.name == "fp8" and fp8_impl(part) == "torch":
        for _, lin in decoder_linears(model, chosen):
            lin.weight.copy_(fake_fp8(lin.weight))
    elif part.name == "nvfp4":
        for _, lin in decoder_linears(model, chosen):
            lin.weight.copy_(fake_nvfp4(lin.weight))
    elif part.name == "noise":
        sigma = float(part.arg("sigma"))
        gen = torch.Generator().manual_seed(int(part.arg("seed")))  # host draws: the same
        for name, p in model.named_parameters():  # noise on every device
            if p.ndim == 2 and "embed" not in name and "lm_head" not in name:
                noise = sigma * float(p.float().std()) * torch.randn(p.shape, generator=gen)
                m = _LAYER.search(name)
                if m is None or int(m.group(1)) in chosen:  # same draws whatever the layers
                    p.add_(noise.to(device=p.device, dtype=p.dtype))


def describe(part: Part) -> dict[str, Any]:
    """What the part does on this machine (for logs): the fp8 implementation chosen."""
    return {"part": part.text, "impl": fp8_impl(part) if part.name == "fp8" else "torch"}
