"""W8A8 arithmetic: the compiled kernel equals the plain-torch integer reference bit for bit, the layer runs it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ember.quant.int8.channel import (
    Int8ChannelTensor,
    int8_products,
    int8_products_int_mm,
    quantize_tokens,
    quantize_weight,
    w8a8_linear_torch,
)
from ember.quant.int8.w8a8_kernels import load_w8a8_kernels
from ember.quant.int8.w8a8_layers import W8A8Linear


def _activations(m: int, cols: int, seed: int) -> torch.Tensor:
    """Token rows with a few loud channels (what a norm's output looks like) and one all-zero row."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(m, cols, generator=generator)
    x[:, : max(1, cols // 32)] *= 30.0
    if m > 2:
        x[1] = 0.0
    return x


def _kernels():
    kernels = load_w8a8_kernels()
    if kernels is None:
        pytest.skip("no C compiler (or EMBER_PURE_TORCH=1): the compiled W8A8 kernel is not built")
    return kernels


@pytest.mark.parametrize(("m", "rows", "cols"), [(1, 48, 64), (3, 17, 100), (8, 40, 576), (13, 33, 96), (2, 8, 2600)])
def test_int32_sums_of_the_kernel_and_of_torch_equal_the_exact_integer_products(m, rows, cols):
    generator = torch.Generator().manual_seed(m * cols)
    x_codes = torch.randint(-127, 128, (m, cols), generator=generator, dtype=torch.int8)
    w_codes = torch.randint(-127, 128, (rows, cols), generator=generator, dtype=torch.int8)
    x_codes[0, :] = 127  # the largest pairs maddubs adds: 2 * 127 * 127 must not saturate
    w_codes[0, :] = -127
    exact = x_codes.long() @ w_codes.long().t()
    assert torch.equal(_kernels().int_products(x_codes, w_codes).long(), exact)
    assert torch.equal(int8_products(x_codes, w_codes).long(), exact)  # float32 GEMM in exact chunks (2600 columns: 3)
    assert torch.equal(int8_products_int_mm(x_codes, w_codes).long(), exact)


@pytest.mark.parametrize(("m", "cols"), [(1, 64), (4, 100), (8, 576), (11, 128)])
@pytest.mark.parametrize("has_bias", [False, True])
def test_compiled_product_equals_the_plain_torch_product_bit_for_bit(m, cols, has_bias):
    weight = quantize_weight(torch.randn(24, cols, generator=torch.Generator().manual_seed(1)) * 0.05)
    bias = torch.randn(24) if has_bias else None
    x = _activations(m, cols, seed=m)
    assert torch.equal(_kernels().linear(x, weight, bias), w8a8_linear_torch(x, weight, bias))


def test_per_token_and_per_channel_rounding_stay_within_half_a_step():
    x = _activations(6, 96, seed=2)
    codes, scales = quantize_tokens(x)
    assert codes.abs().max() <= 127 and torch.equal(codes[1], torch.zeros(96, dtype=torch.int8))
    assert ((codes.float() * scales - x).abs() <= 0.5 * scales + 1e-6).all()
    weight = torch.randn(10, 96) * 0.1
    q = quantize_weight(weight)
    assert ((q.dequantize() - weight).abs() <= 0.5 * q.scales.unsqueeze(1) + 1e-7).all()
    assert torch.equal(Int8ChannelTensor.from_stored(q.stored()).dequantize(), q.dequantize())


def test_layer_output_is_close_to_the_float_product_for_decode_and_prefill_rows():
    weight = torch.randn(32, 128, generator=torch.Generator().manual_seed(3)) * 0.05
    bias = torch.nn.Parameter(torch.randn(32) * 0.1, requires_grad=False)
    layer = W8A8Linear(quantize_weight(weight), bias)
    for m in (1, 8, 13):  # one pass over the weight, and two (8 token rows per pass)
        x = torch.randn(2, m, 128)
        exact = F.linear(x, weight, bias)
        assert (layer(x) - exact).abs().max() <= 0.03 * exact.abs().max()
