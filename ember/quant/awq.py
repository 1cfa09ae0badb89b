"""AWQ (Lin et al. 2023): scale up the input channels that carry large activations before rounding.

For the linears reading one input (q/k/v after a norm, gate/up after a norm, down after the
gated product), search s = mean|x|^alpha over a grid of alpha in [0, 1]; weights become W * s
and the op producing the input absorbs 1/s (a norm's weight, or up_proj's rows for down_proj),
so the float model is unchanged and salient channels get finer steps. The loss of a candidate
is the output error over the calibration inputs, tr(E H E^T) with E = Q(W s)/s - W and
H = X^T X, which needs no stored activations.
"""

from __future__ import annotations

import torch

from ember.quant.grid import BlockGrid

ALPHA_POINTS = 11


def awq_scales(weights: list[torch.Tensor], hessian: torch.Tensor, mean_abs_input: torch.Tensor, grid: BlockGrid) -> torch.Tensor:
    """Per-input-channel scales s [cols] minimising the summed output error of `weights` rounded as Q(W s) / s."""
    base = mean_abs_input.float().clamp(min=1e-6)
    best_scales, best_loss = torch.ones_like(base), float("inf")
    for alpha in torch.linspace(0, 1, ALPHA_POINTS).tolist():
        scales = base.pow(alpha)
        scales = scales / (scales.max() * scales.min()).sqrt()
        loss = sum(_output_error(w, scales, hessian, grid) for w in weights)
        if loss < best_loss:
            best_scales, best_loss = scales, loss
    return best_scales


def _output_error(weight: torch.Tensor, scales: torch.Tensor, hessian: torch.Tensor, grid: BlockGrid) -> float:
    error = grid.fake_quantize(weight * scales) / scales - weight
    return float(((error @ hessian) * error).sum())
