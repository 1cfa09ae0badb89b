"""GGML products against the dequantized float product (the reference), on every path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ember.quant.ggml_blocks import FORMATS
from ember.quant.ggml_kernels import MAX_GEMV_ROWS, load_kernels
from ember.quant.ggml_layers import GGMLEmbedding, GGMLLinear, ggml_linear
from tests.quant.ggml_factory import random_blocks

# float32 sums of 512-768 products in another order: relative error well under 1e-5 of the row norm.
RTOL, ATOL = 1e-4, 1e-4


@pytest.fixture(scope="module")
def kernels():
    loaded = load_kernels()
    if loaded is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set)")
    return loaded


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("m", [1, 3, MAX_GEMV_ROWS])
@pytest.mark.parametrize("portable", [False, True])
def test_gemv_matches_the_dequantized_product(kernels, name, m, portable):
    weight = random_blocks(name, rows=67, cols=768, seed=m)
    generator = torch.Generator().manual_seed(m)
    x = torch.randn(m, 768, generator=generator)
    bias = torch.randn(67, generator=generator)
    expected = F.linear(x, weight.dequantize(), bias)
    ours = kernels.gemv(x, weight, bias, portable=portable)
    torch.testing.assert_close(ours, expected, rtol=RTOL, atol=RTOL * expected.abs().max().item())


@pytest.mark.parametrize("name", ["Q4_1", "Q6_K"])
def test_many_rows_use_dequantized_tiles(kernels, name):
    weight = random_blocks(name, rows=300, cols=512, seed=5)
    x = torch.randn(MAX_GEMV_ROWS + 5, 512, generator=torch.Generator().manual_seed(5))
    expected = F.linear(x, weight.dequantize())
    ours = ggml_linear(x, weight, None, tile_values=512 * 64)  # 5 tiles of 64 rows, the last partial
    torch.testing.assert_close(ours, expected, rtol=RTOL, atol=ATOL)


def test_linear_layer_keeps_the_blocks_and_maps_leading_dimensions():
    weight = random_blocks("Q8_0", rows=40, cols=64, seed=6)
    layer = GGMLLinear(weight)
    assert layer.qweight.dtype == torch.uint8 and dict(layer.state_dict()) == {}
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == (2, 3, 40)
    torch.testing.assert_close(out, F.linear(x, weight.dequantize()), rtol=RTOL, atol=ATOL)


def test_embedding_dequantizes_only_the_looked_up_rows():
    weight = random_blocks("Q8_0", rows=100, cols=64, seed=7)
    ids = torch.tensor([[3, 99], [0, 3]])
    assert torch.equal(GGMLEmbedding(weight)(ids), F.embedding(ids, weight.dequantize()))
