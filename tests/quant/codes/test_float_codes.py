"""NF4 and FP8 quantizers against their definitions: nearest NormalFloat level, torch's e4m3 rounding."""

from __future__ import annotations

import pytest
import torch

from ember.quant.codes.float_codes import E4M3_MAX, quantize_fp8, quantize_nf4
from ember.quant.ggml.blocks import NF4_LEVELS


def _weight(rows: int = 48, cols: int = 192, seed: int = 0) -> torch.Tensor:
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05
    weight[3, :64] = 0.0  # an all-zero block
    weight[5, 7] = 1.5  # an outlier
    return weight


def test_nf4_picks_the_nearest_level_of_each_value_over_its_fp16_absmax():
    weight = _weight()
    blocks = quantize_nf4(weight)
    assert blocks.shape == weight.shape and blocks.nbytes == 48 * 192 // 64 * 34
    d = weight.reshape(48, 3, 64).abs().amax(dim=-1, keepdim=True).half().float()
    levels = torch.tensor(NF4_LEVELS)
    normalized = weight.reshape(48, 3, 64) / torch.where(d > 0, d, torch.ones_like(d))
    nearest = levels[(normalized[..., None] - levels).abs().argmin(dim=-1)]  # brute force reference
    assert torch.equal(blocks.dequantize(), (d * nearest).reshape(48, 192))


def test_fp8_is_torchs_e4m3_rounding_under_the_smallest_power_of_two_scale():
    weight = _weight(seed=1)
    blocks = quantize_fp8(weight)
    assert blocks.nbytes == 48 * 192 // 32 * 33
    grouped = weight.reshape(48, 6, 32)
    amax = grouped.abs().amax(dim=-1, keepdim=True)
    scale = blocks.data.reshape(48, 6, 33)[..., :1].float().sub(127).exp2()
    assert (amax <= E4M3_MAX * scale).all() and ((amax > E4M3_MAX * scale / 2) | (amax == 0)).all()
    expected = (grouped / scale).to(torch.float8_e4m3fn).float() * scale
    assert torch.equal(blocks.dequantize(), expected.reshape(48, 192))


@pytest.mark.parametrize("quantize", [quantize_nf4, quantize_fp8])
def test_a_width_the_blocks_cannot_take_is_refused_with_the_block_size(quantize):
    with pytest.raises(ValueError, match="multiples of (64|32)"):
        quantize(torch.zeros(4, 48))
