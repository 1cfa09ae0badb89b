"""The compiled CPU GEMV against torch's product (the reference), and when Linear uses it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ember.layers import cpu_gemv
from ember.layers.linear import Linear


@pytest.fixture(scope="module")
def gemv():
    kernel = cpu_gemv.load_gemv()
    if kernel is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set): the kernel is unavailable")
    return kernel


@pytest.mark.parametrize(("rows", "cols", "m"), [(960, 576, 1), (577, 63, 3), (49152, 576, 2), (5, 1, 4)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_torch_linear(gemv, rows, cols, m, with_bias):
    generator = torch.Generator().manual_seed(rows + cols + m)
    weight = torch.randn(rows, cols, generator=generator)
    bias = torch.randn(rows, generator=generator) if with_bias else None
    x = torch.randn(m, cols, generator=generator)
    expected = F.linear(x, weight, bias)
    assert torch.allclose(gemv(x, weight, bias), expected, rtol=1e-5, atol=1e-4)


def test_linear_takes_the_kernel_only_for_a_few_float32_rows_without_autograd():
    weight = torch.zeros(8, 4)
    assert cpu_gemv.can_use(torch.zeros(1, 4), weight) == (not torch.is_grad_enabled())
    with torch.inference_mode():
        assert cpu_gemv.can_use(torch.zeros(4, 4), weight)
        assert not cpu_gemv.can_use(torch.zeros(cpu_gemv.MAX_ROWS + 1, 4), weight)
        assert cpu_gemv.can_use(torch.zeros(1, 4, dtype=torch.bfloat16), weight.bfloat16())
        assert not cpu_gemv.can_use(torch.zeros(1, 4, dtype=torch.float16), weight.half())
        assert not cpu_gemv.can_use(torch.zeros(1, 4), weight.t().contiguous().t())  # weight not contiguous


def test_bfloat16_weights_accumulate_in_float32(gemv):
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(300, 576, generator=generator).bfloat16()
    x = torch.randn(2, 576, generator=generator).bfloat16()
    expected = F.linear(x.float(), weight.float()).bfloat16()
    ours = gemv(x, weight, None)
    assert ours.dtype == torch.bfloat16
    assert torch.allclose(ours.float(), expected.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("m", [1, 3, 9])
def test_linear_layer_gives_the_same_result_on_both_paths(m):
    torch.manual_seed(0)
    layer = Linear(64, 96, bias=True)
    x = torch.randn(m, 64)
    with torch.inference_mode():
        ours = layer(x)
    assert torch.allclose(ours, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
