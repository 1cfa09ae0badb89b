"""SmoothQuant: the migration is exact in float, balances the ranges it promises, and makes W8A8 more accurate."""

from __future__ import annotations

import torch

from ember.quant.int8.channel import quantize_weight, w8a8_linear_torch
from ember.quant.methods.smoothquant import fold_scales, smoothing_scales


def _outlier_layer(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [tokens, cols] with a few channels ~50x the others (the paper's observation) and a weight."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 256, generator=generator)
    x[:, [3, 70, 200]] *= 50.0
    return x, torch.randn(96, 256, generator=generator) * 0.05


def test_at_alpha_one_half_the_smoothed_activation_and_weight_ranges_are_equal_per_channel():
    x, weight = _outlier_layer()
    scales = smoothing_scales(x.abs().amax(0), weight, alpha=0.5)
    torch.testing.assert_close((x / scales).abs().amax(0), (weight * scales).abs().amax(0), rtol=1e-5, atol=0)


def test_folding_the_scales_leaves_the_float_product_unchanged():
    x, weight = _outlier_layer(seed=1)
    norm_weight = torch.rand(256) + 0.5
    smoothed_weight, smoothed_norm = weight.clone(), norm_weight.clone()
    fold_scales(smoothed_weight, smoothed_norm, smoothing_scales(x.abs().amax(0), weight, alpha=0.8))
    # the norm's output x * g becomes x * g / s; the weight's columns carry s
    torch.testing.assert_close((x * smoothed_norm) @ smoothed_weight.t(), (x * norm_weight) @ weight.t(), rtol=1e-5, atol=1e-4)


def test_smoothing_cuts_the_w8a8_error_of_a_layer_with_outlier_channels():
    x, weight = _outlier_layer(seed=2)
    exact = x @ weight.t()
    plain = w8a8_linear_torch(x, quantize_weight(weight), None)
    scales = smoothing_scales(x.abs().amax(0), weight, alpha=0.5)
    smoothed = w8a8_linear_torch(x / scales, quantize_weight(weight * scales), None)
    assert (smoothed - exact).norm() < 0.5 * (plain - exact).norm()


def test_channels_that_never_fired_keep_a_unit_scale():
    weight = torch.randn(8, 4)
    scales = smoothing_scales(torch.tensor([2.0, 0.0, 1.0, 3.0]), weight, alpha=0.5)
    assert scales[1] == 1.0 and (scales > 0).all()
