"""Fake-quant kernels against hand-computed values: grids, ties, saturation, block scales."""

import pytest
import torch

from opdflow.engines.fakequant import (
    e2m1_round,
    e4m3_round,
    fake_fp8,
    fake_fp8_per_head,
    fake_nvfp4,
    fp8_scale,
)


def _t(values):
    return torch.tensor(values, dtype=torch.float32)


def test_e4m3_grid_points_are_fixed_points():
    grid = [0.0, 2**-9, 3 * 2**-9, 2**-6, 1.0, 1.125, 1.875, 2.0, 2.25, 240.0, 256.0, 288.0, 448.0]
    x = _t(grid + [-g for g in grid])
    assert torch.equal(e4m3_round(x), x)


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (1.0625, 1.0),  # tie between 1.0 (even) and 1.125
        (1.1875, 1.25),  # tie between 1.125 and 1.25 (even)
        (1.1, 1.125),
        (300.0, 288.0),  # spacing 32 in [256, 512)
        (2**-10, 0.0),  # half the smallest subnormal: tie to even (0)
        (3 * 2**-10, 2**-8),  # tie between 1 and 2 subnormal steps: to 2
        (500.0, 448.0),  # saturation, no infinities
        (1e9, 448.0),
        (-1e9, -448.0),
        (464.0, 448.0),
    ],
)
def test_e4m3_rounding_and_saturation(x, expected):
    assert e4m3_round(_t([x])).item() == expected
    assert e4m3_round(_t([-x])).item() == -expected


def test_e4m3_matches_torch_float8_cast_within_range():
    x = torch.randn(20000, generator=torch.Generator().manual_seed(0)) * 30
    x = x.clamp(-448, 448)
    assert torch.equal(e4m3_round(x), x.to(torch.float8_e4m3fn).float())


def test_fp8_per_tensor_scale():
    x = _t([1.0, 0.3, -14.0])
    assert fp8_scale(x).item() == pytest.approx(14.0 / 448)
    # x / scale = [32, 9.6, -448]; 9.6 lies in [8, 16) with spacing 1 -> 10 -> 10/32
    assert fake_fp8(x).tolist() == pytest.approx([1.0, 0.3125, -14.0])
    assert torch.equal(fake_fp8(torch.zeros(5)), torch.zeros(5))
    # a static scale saturates values beyond 448 * scale
    assert fake_fp8(_t([10.0, 1.0]), scale=1 / 448).tolist() == pytest.approx([1.0, 1.0])
    assert fake_fp8(x.bfloat16()).dtype == torch.bfloat16


def test_fp8_per_head_scales():
    x = torch.ones(1, 2, 3, 4)
    x[0, 1] *= 100.0
    out = fake_fp8_per_head(x * 1.1, torch.tensor([1.0, 100.0]))
    assert torch.allclose(out[0, 0], torch.full((3, 4), 1.125))
    assert torch.allclose(out[0, 1], torch.full((3, 4), 112.5))


def test_e2m1_grid_ties_and_saturation():
    grid = _t([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    assert torch.equal(e2m1_round(grid), grid)
    assert torch.equal(e2m1_round(-grid), -grid)
    ties = _t([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert e2m1_round(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert e2m1_round(_t([7.0, 100.0, -9.0, 0.3, 2.7])).tolist() == [6.0, 6.0, -6.0, 0.5, 3.0]


def test_nvfp4_block_scales_and_zero_blocks():
    x = torch.zeros(4, 16)
    # block 0 holds the tensor amax 2688 = 6 * 448: global scale 1, block scale 448
    x[0, 0], x[0, 1] = 2688.0, 1000.0  # 1000 / 448 = 2.23 -> 2 -> 896
    # block 1: amax 6 -> block scale e4m3(1) = 1, values on the E2M1 grid directly
    x[1, :7] = _t([6.0, 3.0, 1.25, 0.25, 5.0, 2.5, 0.75])
    # block 2: amax 6.5 -> 6.5 / 6 = 1.083 -> E4M3 1.125; 6.5 / 1.125 = 5.78 -> 6 -> 6.75
    x[2, 0], x[2, 1] = 6.5, 1.0  # 1 / 1.125 = 0.89 -> 1 -> 1.125
    # block 3: all zeros stays zero (no division by a zero block scale)
    out = fake_nvfp4(x)
    assert out[0, :2].tolist() == [2688.0, 896.0]
    assert out[1, :7].tolist() == [6.0, 3.0, 1.0, 0.0, 4.0, 2.0, 1.0]
    assert out[2, :2].tolist() == pytest.approx([6.75, 1.125])
    assert torch.equal(out[3], torch.zeros(16))
    assert torch.isfinite(out).all()
    assert torch.equal(fake_nvfp4(torch.zeros(3, 32)), torch.zeros(3, 32))


def test_nvfp4_blocks_run_along_the_last_axis_and_pad():
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    out = fake_nvfp4(x)
    assert out.shape == x.shape
    rel = (out - x).norm() / x.norm()
    assert 0.02 < rel < 0.25  # 4-bit: visibly lossy, never garbage
    # a block's values, divided by its effective scale, lie on the E2M1 grid
    g = x.abs().max() / (448 * 6)
    block = x[0, :16]
    scale = e4m3_round(block.abs().max() / (6 * g)) * g
    assert torch.allclose(out[0, :16] / scale, e2m1_round(block / scale), atol=1e-5)
