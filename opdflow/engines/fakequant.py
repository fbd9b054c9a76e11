"""Fake quantization in pure torch: round to a low-precision float grid, return high precision.

The CPU stand-ins for what FP8 and NVFP4 hardware paths do to a tensor, so mismatch can be
measured anywhere (Model Optimizer's NVFP4 kernels need CUDA). Every function returns a
tensor of the input's dtype and shape whose values lie on the target grid times a scale.

- FP8 E4M3 ("e4m3fn"): 3 mantissa bits, smallest normal 2^-6, largest 448, no infinities.
  Per-tensor scale amax / 448; values beyond +-448 * scale saturate.
- NVFP4: E2M1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} in blocks of 16 along the last axis; each
  block has an E4M3 scale, and the tensor an FP32 global scale amax / (448 * 6), so a
  block's effective scale is e4m3(block_amax / (6 * global)) * global.

Rounding is to nearest, ties to even (torch.round), as in the hardware conversions.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16


def round_to_float_grid(
    x: torch.Tensor, mantissa_bits: int, min_normal_exp: int, max_value: float
) -> torch.Tensor:
    """Round float32 `x` to the nearest value of a sign-magnitude float format, saturating.

    The grid spacing in binade [2^e, 2^(e+1)) is 2^(e - mantissa_bits), with e clamped below at
    `min_normal_exp` (subnormals share the smallest normal binade's spacing).
    """
    x = x.float().clamp(-max_value, max_value)
    _, exp = torch.frexp(x)  # x = m * 2^exp with |m| in [0.5, 1): floor(log2|x|) = exp - 1
    e = (exp - 1).clamp_min(min_normal_exp)
    step = torch.ldexp(torch.ones_like(x), e - mantissa_bits)
    return (torch.round(x / step) * step).clamp(-max_value, max_value)


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """Nearest FP8 E4M3 value (float32), saturating at +-448."""
    return round_to_float_grid(x, mantissa_bits=3, min_normal_exp=-6, max_value=E4M3_MAX)


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """Nearest FP4 E2M1 value (float32), saturating at +-6."""
    return round_to_float_grid(x, mantissa_bits=1, min_normal_exp=0, max_value=E2M1_MAX)


def fp8_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor E4M3 scale amax / 448 (float32 scalar; 1 for an all-zero tensor)."""
    amax = x.detach().abs().amax().float()
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def fake_fp8(x: torch.Tensor, scale: torch.Tensor | float | None = None) -> torch.Tensor:
    """E4M3 fake quantization with a per-tensor scale (default: dynamic, amax / 448)."""
    if scale is None:
        scale = fp8_scale(x)
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return (e4m3_round(x.float() / scale) * scale).to(x.dtype)


def fake_fp8_per_head(x_B_H_T_D: torch.Tensor, scale_H: torch.Tensor) -> torch.Tensor:
    """E4M3 fake quantization of [batch, heads, time, dim] states with one scale per head."""
    scale = scale_H.float().view(1, -1, 1, 1).to(x_B_H_T_D.device)
    return (e4m3_round(x_B_H_T_D.float() / scale) * scale).to(x_B_H_T_D.dtype)


def fake_nvfp4(x: torch.Tensor, block: int = NVFP4_BLOCK) -> torch.Tensor:
    """NVFP4 fake quantization along the last axis (zero-padded to a multiple of `block`)."""
    shape, dtype = x.shape, x.dtype
    flat = x.float().reshape(-1, shape[-1])
    pad = (-shape[-1]) % block
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    blocks = flat.reshape(flat.shape[0], -1, block)
    amax = flat.abs().amax()
    if amax == 0:
        return x.clone()
    global_scale = amax / (E4M3_MAX * E2M1_MAX)
    block_amax = blocks.abs().amax(-1, keepdim=True)
    block_scale = e4m3_round(block_amax / (E2M1_MAX * global_scale)) * global_scale
    safe = torch.where(block_scale > 0, block_scale, torch.ones_like(block_scale))
    q = torch.where(block_scale > 0, e2m1_round(blocks / safe) * safe, torch.zeros_like(blocks))
    q = q.reshape(flat.shape[0], -1)[:, : shape[-1]]
    return q.reshape(shape).to(dtype)
