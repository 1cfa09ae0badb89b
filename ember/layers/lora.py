"""LoRA beside a linear layer: out = base(x) + B_s (A_s x) for the rows whose request holds adapter slot s.

One step batches requests of different adapters (and of none). Punica's SGMV / S-LoRA idea, in torch: the step's
rows are grouped by adapter slot once (`LoRARows`), and every adapted layer does, per slot present, a gather of
those rows, two small matrix products (shrink to rank r, expand to the output) and a scatter-add into the base
layer's output. Rows without an adapter are never touched, so the base product stays the layer's own (float
panels, GGML blocks, W8A8 rows: whatever `base` is); the adapter stays float beside it (QLoRA serving).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class LoRAProduct:
    """One adapter's product on one layer: `a` [k, in] then `b` [out, k], the scaling folded into `b`.

    A fused layer (q/k/v, gate/up) takes each part's A stacked (k = parts x r) and a block-diagonal B, so the
    parts' adapters run as the same two products; a part the adapter leaves out has zero rows in both."""

    a: torch.Tensor
    b: torch.Tensor

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """B (A x) for rows x [rows, in], in the adapter's dtype."""
        return (x.to(self.a.dtype) @ self.a.T) @ self.b.T


@dataclass
class LoRARows:
    """This step's rows grouped by adapter slot: [(slot, rows)], rows a slice where contiguous, else an index tensor.

    One object per adapted model, shared by its `LoRALinear` layers and rewritten by the adapter pool before each
    forward (the rows of a step are the same for every layer); empty when no row of the step has an adapter."""

    groups: list[tuple[int, slice | torch.Tensor]] = field(default_factory=list)

    def set_rows(self, row_slots: list[int]) -> None:
        """Group rows by their slot (-1: no adapter) for the next forward."""
        by_slot: dict[int, list[int]] = {}
        for row, slot in enumerate(row_slots):
            if slot >= 0:
                by_slot.setdefault(slot, []).append(row)
        self.groups = [(slot, _as_rows(rows)) for slot, rows in by_slot.items()]


def _as_rows(rows: list[int]) -> slice | torch.Tensor:
    """A contiguous run as a slice (a view, no gather), else an index tensor."""
    if rows[-1] - rows[0] + 1 == len(rows):
        return slice(rows[0], rows[-1] + 1)
    return torch.tensor(rows, dtype=torch.long)


class LoRALinear(nn.Module):
    """A linear layer (float or quantized: `base`) with a fixed number of adapter slots beside it.

    `slots[s]` is the product of the adapter the pool put in slot s, or None where that adapter does not touch
    this layer (or the slot is free). The slots are filled and emptied by the adapter pool; the forward reads
    `rows`, the step's grouping, and adds each present slot's product to its rows only."""

    def __init__(self, base: nn.Module, rows: LoRARows, num_slots: int) -> None:
        super().__init__()
        self.base = base
        self.rows = rows
        self.slots: list[LoRAProduct | None] = [None] * num_slots

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        for slot, rows in self.rows.groups:
            product = self.slots[slot]
            if product is None:
                continue
            if isinstance(rows, slice):
                out[rows] += product.delta(x[rows]).to(out.dtype)
            else:
                out.index_add_(0, rows, product.delta(x.index_select(0, rows)).to(out.dtype))
        return out
