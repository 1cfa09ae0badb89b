"""GPTQ (Frantar et al. 2022, arXiv:2210.17323): round one column at a time, pushing each rounding
error onto the columns not yet rounded through the inverse Hessian of the layer's inputs.

H = X^T X over calibration activations. With H^-1 = U^T U (upper Cholesky factor U), rounding
column i leaves error e = (w_i - q_i) / U_ii, and the remaining columns move by -e U_i,i+1:.
"Lazy batch" updates apply this inside a block of columns (128, the paper's B) and to the rest
of the matrix once per block (one GEMM instead of one rank-1 update per column). Damping adds a
fraction (1%, the paper's lambda) of the mean diagonal to H so the factorisation exists.

Groups: a group's (d, m) is fitted when the sweep first reaches one of its columns, on that
group's weights as they are then (already moved by the errors of every column rounded before),
as the reference implementation does; fitting on the original weights instead ("static groups")
lets the accumulated updates push columns outside their group's range, where they clip. With
act-order, columns are visited by decreasing H_ii while groups stay the file's column ranges
(so the result packs into GGML blocks): a group is fitted at its first-visited column, on all
of its columns' current values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ember.quant.codes.grid import BlockGrid


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
    rows, cols = w.shape
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    order = torch.argsort(h.diagonal(), descending=True, stable=True) if settings.act_order else torch.arange(cols)
    w, h = w[:, order], h[order][:, order]
    h.diagonal().add_(settings.damp * h.diagonal().mean())
    u = _inverse_cholesky_upper(h)
    groups = _GroupFits(grid, order, rows)
    codes = torch.zeros_like(w)
    for start in range(0, cols, settings.block_size):
        end = min(start + settings.block_size, cols)
        block, errors = w[:, start:end].clone(), torch.zeros(rows, end - start)
        u_block = u[start:end, start:end]
        for i in range(end - start):
            position = start + i
            if not groups.fitted(position):
                groups.fit(position, _current_columns(w, block, errors[:, :i], u, start, groups.positions(position)))
            d, m = groups.params(position)
            column = block[:, i]
            q = grid.quantize(column, d, m)
            codes[:, position] = q
            error = (column - grid.dequantize(q, d, m)) / u_block[i, i]
            block[:, i:] -= error.unsqueeze(1) * u_block[i, i:].unsqueeze(0)
            errors[:, i] = error
        w[:, end:] -= errors @ u[start:end, end:]
    return codes[:, torch.argsort(order)], groups.d, groups.m


def _current_columns(w: torch.Tensor, block: torch.Tensor, errors: torch.Tensor, u: torch.Tensor, start: int,
                     positions: torch.Tensor) -> torch.Tensor:
    """The weights at sweep `positions` (none rounded yet) as they stand now: the block's copy inside the
    block; past it, `w` less the updates this block has not yet handed on (its errors so far)."""
    end = start + block.shape[1]
    inside, outside = positions[positions < end], positions[positions >= end]
    current = torch.cat([block[:, inside - start], w[:, outside] - errors @ u[start : start + errors.shape[1], outside]], dim=1)
    return current


class _GroupFits:
    """Each file-order group's (d, m), fitted once, at the sweep position that first reaches the group."""

    def __init__(self, grid: BlockGrid, order: torch.Tensor, rows: int) -> None:
        self.grid = grid
        self.group_at = order // grid.group_size  # file group of each sweep position
        count = int(self.group_at.max()) + 1
        self.d, self.m = torch.zeros(rows, count), torch.zeros(rows, count)
        self.done = [False] * count

    def fitted(self, position: int) -> bool:
        return self.done[int(self.group_at[position])]

    def positions(self, position: int) -> torch.Tensor:
        """Sweep positions of the columns in the group of `position`."""
        return torch.nonzero(self.group_at == self.group_at[position]).flatten()

    def fit(self, position: int, values: torch.Tensor) -> None:
        group = int(self.group_at[position])
        d, m = self.grid.fit(values)  # values holds at most group_size columns: one group
        self.d[:, group], self.m[:, group] = d[:, 0], m[:, 0]
        self.done[group] = True

    def params(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        group = int(self.group_at[position])
        return self.d[:, group], self.m[:, group]


def _inverse_cholesky_upper(h: torch.Tensor) -> torch.Tensor:
    """Upper Cholesky factor of H^-1; raises naming the fix when H is not positive definite."""
    try:
        inverse = torch.cholesky_inverse(torch.linalg.cholesky(h))
        return torch.linalg.cholesky(inverse, upper=True)
    except torch.linalg.LinAlgError as error:
        raise ValueError("GPTQ: the calibration Hessian is not positive definite; raise --damp or give more calibration text") from error
