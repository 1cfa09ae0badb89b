"""RTN, GPTQ and AWQ on block grids: exact packing, GPTQ's error below RTN's, AWQ's folding exact."""

from __future__ import annotations

import pytest
import torch

from ember.quant.codes.grid import BlockGrid
from ember.quant.methods.awq import awq_clipped_ranges, awq_scales
from ember.quant.methods.gptq import GPTQSettings, gptq_quantize


def _layer(rows: int = 64, cols: int = 128, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight and the Hessian of correlated inputs with a few loud channels (what real activations look like)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=generator) * 0.05
    mixing = torch.randn(cols, cols, generator=generator) / cols**0.5 + torch.eye(cols)
    x = torch.randn(4 * cols, cols, generator=generator) @ mixing
    x[:, :4] *= 20.0
    return weight, x.T @ x / x.shape[0]


def _output_error(weight: torch.Tensor, approx: torch.Tensor, hessian: torch.Tensor) -> float:
    error = approx - weight
    return float(((error @ hessian) * error).sum())


@pytest.mark.parametrize(("bits", "symmetric", "group_size"), [(4, False, 32), (4, False, 128), (4, True, 64), (8, False, 32)])
def test_blocks_decode_to_exactly_the_grid_values(bits, symmetric, group_size):
    grid = BlockGrid(bits, group_size, symmetric)
    weight, _ = _layer(cols=160)  # the last group of 128 is partial
    d, m = grid.fit(weight)
    cols = weight.shape[1]
    codes = grid.quantize(weight, grid.per_column(d, cols), grid.per_column(m, cols))
    expected = grid.dequantize(codes, grid.per_column(d, cols), grid.per_column(m, cols))
    assert torch.equal(grid.to_blocks(codes, d, m).dequantize(), expected)
    # half a step, or a whole one at the clamped end of llama.cpp's symmetric range ([-8, 7] steps)
    steps = 1.01 if symmetric else 0.51
    assert ((expected - weight).abs() <= steps * grid.per_column(d, cols).abs() + 1e-6).all()


def _correlated_layer(rows: int = 96, cols: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A random linear layer's weight and calibration inputs X whose channels are strongly correlated."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=generator) * 0.05
    mixing = torch.randn(cols // 4, cols, generator=generator)  # every channel a mix of cols/4 sources
    x = torch.randn(8 * cols, cols // 4, generator=generator) @ mixing + 0.1 * torch.randn(8 * cols, cols, generator=generator)
    return weight, x


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group_size", [32, 128])
def test_gptq_output_error_is_below_round_to_nearest_on_the_same_grid(act_order, group_size):
    weight, x = _correlated_layer()
    grid = BlockGrid(4, group_size)
    codes, d, m = gptq_quantize(weight, x.T @ x / x.shape[0], grid, GPTQSettings(act_order=act_order))
    cols = weight.shape[1]
    gptq = grid.dequantize(codes, grid.per_column(d, cols), grid.per_column(m, cols))
    assert torch.equal(grid.to_blocks(codes, d, m).dequantize(), gptq)  # what the kernels run
    gptq_error = torch.linalg.norm(x @ weight.T - x @ gptq.T)
    rtn_error = torch.linalg.norm(x @ weight.T - x @ grid.fake_quantize(weight).T)
    assert gptq_error < 0.7 * rtn_error


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_output_error_is_below_round_to_nearest_with_loud_channels(act_order):
    weight, hessian = _layer()
    grid = BlockGrid(4, 32)
    codes, d, m = gptq_quantize(weight, hessian, grid, GPTQSettings(act_order=act_order))
    cols = weight.shape[1]
    gptq = grid.dequantize(codes, grid.per_column(d, cols), grid.per_column(m, cols))
    rtn = grid.fake_quantize(weight)
    assert _output_error(weight, gptq, hessian) < 0.8 * _output_error(weight, rtn, hessian)


def test_awq_scales_lower_the_output_error_of_rounding():
    weight, hessian = _layer(seed=1)
    mean_abs = hessian.diagonal().sqrt()  # stands in for mean |x|: the loud channels stand out
    grid = BlockGrid(4, 128)
    scales = awq_scales([weight], hessian, mean_abs, grid)
    awq = grid.fake_quantize(weight * scales) / scales
    assert _output_error(weight, awq, hessian) < _output_error(weight, grid.fake_quantize(weight), hessian)


@pytest.mark.parametrize(("bits", "symmetric"), [(4, False), (4, True), (8, False)])
def test_awq_clipping_lowers_the_output_error_row_by_row(bits, symmetric):
    weight, hessian = _layer(cols=160, seed=2)  # the last group of 128 is partial
    weight[::3, 7] = 0.6  # outlying weights on a quiet input channel: clipping them buys finer steps for their groups
    hessian[7, :] *= 0.1
    hessian[:, 7] *= 0.1
    grid = BlockGrid(bits, 128, symmetric)
    cols = weight.shape[1]

    within_groups = torch.block_diag(*[hessian[i : i + 128, i : i + 128] for i in range(0, cols, 128)])

    def row_errors(d: torch.Tensor, m: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        d, m = grid.per_column(d, cols), grid.per_column(m, cols)
        error = grid.dequantize(grid.quantize(weight, d, m), d, m) - weight
        return ((error @ h) * error).sum(dim=1)

    plain, clipped = grid.fit(weight), awq_clipped_ranges(weight, hessian, grid)
    # What the search minimises (each group's own error) never grows; the whole output error drops.
    assert (row_errors(*clipped, within_groups) <= row_errors(*plain, within_groups) * (1 + 1e-5)).all()
    assert row_errors(*clipped, hessian).sum() < 0.9 * row_errors(*plain, hessian).sum()


def test_grid_refuses_what_the_kernels_cannot_take():
    with pytest.raises(ValueError, match="multiple of 32"):
        BlockGrid(4, 48)
    with pytest.raises(ValueError, match="4 or 8 bits"):
        BlockGrid(3, 32)
    with pytest.raises(ValueError, match="not a multiple of 32"):
        BlockGrid(4, 32).check_width(72, "model.layers.0.mlp.down_proj")
