"""GPTQ (Frantar et al. 2022): round one column at a time, pushing each rounding error onto the
columns not yet rounded through the inverse Hessian of the layer's inputs.

H = X^T X over calibration activations. With H^-1 = U^T U (upper Cholesky factor U), rounding
column i leaves error e = (w_i - q_i) / U_ii, and the remaining columns move by -e U_i,i+1:.
"Lazy batch" updates apply this inside a block of columns and to the rest of the matrix once per
block (one GEMM instead of one rank-1 update per column). Damping adds a fraction of the mean
diagonal to H so the factorisation exists. With act-order, columns are visited by decreasing
H_ii; groups stay the file's column ranges ("static groups", fitted before any update), so the
result still packs into GGML blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ember.quant.grid import BlockGrid


@dataclass(frozen=True)
class GPTQSettings:
    damp: float = 0.01
    block_size: int = 128
    act_order: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.damp < 1:
            raise ValueError(f"GPTQ damping {self.damp} must lie in (0, 1), e.g. 0.01")
        if self.block_size < 1:
            raise ValueError("GPTQ block size must be at least 1")


def gptq_quantize(
    weight: torch.Tensor, hessian: torch.Tensor, grid: BlockGrid, settings: GPTQSettings
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integer codes [rows, cols] and per-group (d, m) [rows, groups] for `weight` under `hessian` [cols, cols]."""
    w = weight.detach().float().clone()
    h = hessian.detach().float().clone()
    cols = w.shape[1]
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    d, m = grid.fit(w)  # static groups: fitted once, in file order
    order = torch.argsort(h.diagonal(), descending=True) if settings.act_order else torch.arange(cols)
    w, h = w[:, order], h[order][:, order]
    h.diagonal().add_(settings.damp * h.diagonal().mean())
    u = _inverse_cholesky_upper(h)
    d_cols, m_cols = grid.per_column(d, cols)[:, order], grid.per_column(m, cols)[:, order]
    codes = torch.zeros_like(w)
    for start in range(0, cols, settings.block_size):
        end = min(start + settings.block_size, cols)
        block, errors = w[:, start:end].clone(), torch.zeros(w.shape[0], end - start)
        u_block = u[start:end, start:end]
        for i in range(end - start):
            column = block[:, i]
            q = grid.quantize(column, d_cols[:, start + i], m_cols[:, start + i])
            codes[:, start + i] = q
            error = (column - grid.dequantize(q, d_cols[:, start + i], m_cols[:, start + i])) / u_block[i, i]
            block[:, i:] -= error.unsqueeze(1) * u_block[i, i:].unsqueeze(0)
            errors[:, i] = error
        w[:, end:] -= errors @ u[start:end, end:]
    return codes[:, torch.argsort(order)], d, m


def _inverse_cholesky_upper(h: torch.Tensor) -> torch.Tensor:
    """Upper Cholesky factor of H^-1; raises naming the fix when H is not positive definite."""
    try:
        inverse = torch.cholesky_inverse(torch.linalg.cholesky(h))
        return torch.linalg.cholesky(inverse, upper=True)
    except torch.linalg.LinAlgError as error:
        raise ValueError("GPTQ: the calibration Hessian is not positive definite; raise --damp or give more calibration text") from error
