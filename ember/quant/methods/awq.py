"""AWQ (Lin et al. 2023): scale up the input channels that carry large activations before rounding.

For the linears reading one input (q/k/v after a norm, gate/up after a norm, down after the
gated product), search s = mean|x|^alpha over a grid of alpha in [0, 1]; weights become W * s
and the op producing the input absorbs 1/s (a norm's weight, or up_proj's rows for down_proj),
so the float model is unchanged and salient channels get finer steps. The loss of a candidate
is the output error over the calibration inputs, tr(E H E^T) with E = Q(W s)/s - W and
H = X^T X, which needs no stored activations.

Then, as AWQ's released method does, a clipping search: each group's range is shrunk to a ratio
of its largest magnitude (1.0, 0.95, ..., 0.55) where that lowers the group's own output error
e_g H_gg e_g^T, trading a clipped outlier for finer steps on the rest of the group. Ratio 1.0 is
plain rounding, so no group's own error grows (the cross-group terms of tr(E H E^T) are not searched).
"""

from __future__ import annotations

import torch

from ember.quant.codes.grid import BlockGrid

ALPHA_POINTS = 11
CLIP_RATIOS = tuple(1.0 - step / 20 for step in range(10))  # AWQ's grid: twenty steps towards half the range, the first ten


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


def awq_clipped_ranges(weight: torch.Tensor, hessian: torch.Tensor, grid: BlockGrid) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group (d, m) [rows, groups], each group's range clipped at the ratio of `CLIP_RATIOS` that gives the
    lowest output error of the group's own columns under `hessian` [cols, cols]."""
    weight = weight.detach().float()
    groups = [slice(start, start + grid.group_size) for start in range(0, weight.shape[1], grid.group_size)]
    fits = [_best_clip(weight[:, columns], hessian[columns, columns], grid) for columns in groups]
    return torch.stack([d for d, _ in fits], dim=1), torch.stack([m for _, m in fits], dim=1)


def _best_clip(weight: torch.Tensor, hessian: torch.Tensor, grid: BlockGrid) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, m) [rows] of one group's columns: the clip ratio with the least output error, row by row."""
    largest = weight.abs().amax(dim=1, keepdim=True)
    best_loss = torch.full((weight.shape[0],), float("inf"))
    best_d, best_m = torch.zeros(weight.shape[0]), torch.zeros(weight.shape[0])
    for ratio in CLIP_RATIOS:
        d, m = grid.fit(torch.maximum(torch.minimum(weight, ratio * largest), -ratio * largest))
        error = grid.dequantize(grid.quantize(weight, d, m), d, m) - weight
        loss = ((error @ hessian) * error).sum(dim=1)
        better = loss < best_loss
        best_loss = torch.where(better, loss, best_loss)
        best_d, best_m = torch.where(better, d[:, 0], best_d), torch.where(better, m[:, 0], best_m)
    return best_d, best_m
