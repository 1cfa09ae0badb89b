"""Group-wise integer weights with a zero point per group, held in ember's GGML blocks plus a correction.

GPTQ and AWQ checkpoints store W[o, i] = s[g, o] * (q[o, i] - z[g, o]) with g = g_idx[i], s float16 and
q, z integers. A GGML block decodes d * (q - c) (Q4_0: c = 8; Q8_0 keeps q - c as int8 with c = 128), so

    W = blocks(d = s, codes q)  +  offsets[o, g],   offsets = s * (c - z)  (float32),

and y = x W^T = blocks product + (sum of x over each group) @ offsets^T. Every term is exact in float32
(s has 11 significant bits, q - c and c - z at most 9), so `dequantize()` returns s * (q - z) bit for bit.
A group must cover whole 32-value blocks. An act-order checkpoint (`desc_act`: g_idx not sorted) is held
with its columns sorted by group (`input_order`); the layer gathers x's columns in that order first.
Where every offset is zero (symmetric GPTQ) and the columns are in order, the weight is a plain
`GGMLTensor` and runs on the compiled decoder layer like any GGUF weight.
"""

from __future__ import annotations

import torch

from ember.quant.ggml.blocks import GGMLTensor


class ZeroPointTensor:
    """W [rows, cols] = blocks (columns in `input_order`) + offsets[:, column_groups] (see the module docstring).

    `offsets`: float32 [rows, groups] or None (all zero); `column_groups`: int64 [cols], the group of each
    stored column (non-decreasing); `input_order`: int64 [cols], the checkpoint column each stored column
    holds, or None (stored in checkpoint order)."""

    def __init__(self, blocks: GGMLTensor, offsets: torch.Tensor | None, column_groups: torch.Tensor,
                 input_order: torch.Tensor | None) -> None:
        rows, cols = blocks.shape
        if column_groups.dtype != torch.int64 or tuple(column_groups.shape) != (cols,):
            raise ValueError(f"column groups must be int64 [{cols}], got {column_groups.dtype} {tuple(column_groups.shape)}")
        if offsets is not None and (offsets.dtype != torch.float32 or offsets.dim() != 2 or offsets.shape[0] != rows
                                    or offsets.shape[1] <= int(column_groups.max())):
            raise ValueError(f"offsets must be float32 [{rows}, groups], got {offsets.dtype} {tuple(offsets.shape)}")
        if input_order is not None and (input_order.dtype != torch.int64 or tuple(input_order.shape) != (cols,)):
            raise ValueError(f"input order must be int64 [{cols}], got {input_order.dtype} {tuple(input_order.shape)}")
        self.blocks = blocks
        self.offsets = None if offsets is None else offsets.contiguous()
        self.column_groups = column_groups.contiguous()
        self.input_order = input_order

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, cols] in checkpoint column order: s * (q - z), exact."""
        values = self.blocks.dequantize()
        if self.offsets is not None:
            values = values + self.offsets[:, self.column_groups]
        if self.input_order is None:
            return values
        ordered = torch.empty_like(values)
        ordered[:, self.input_order] = values
        return ordered

    def simplified(self) -> GGMLTensor | ZeroPointTensor:
        """The plain blocks where there is nothing to add and no column to reorder, else self."""
        return self.blocks if self.offsets is None and self.input_order is None else self

    @staticmethod
    def fusable(parts: list[ZeroPointTensor]) -> bool:
        """Whether `parts` can stack as rows of one weight: one block format and width, the same column
        groups and column order (q, k and v of an act-order checkpoint share theirs when their Hessians do)."""
        first = parts[0]
        return all(
            p.blocks.format == first.blocks.format and p.blocks.cols == first.blocks.cols
            and torch.equal(p.column_groups, first.column_groups)
            and (p.input_order is None) == (first.input_order is None)
            and (p.input_order is None or torch.equal(p.input_order, first.input_order))
            for p in parts
        )

    @staticmethod
    def concat(parts: list[ZeroPointTensor]) -> ZeroPointTensor:
        """Rows of `parts` stacked in order (a fused projection); call only where `fusable(parts)`."""
        first = parts[0]
        offsets = None
        if any(p.offsets is not None for p in parts):
            groups = next(p.offsets.shape[1] for p in parts if p.offsets is not None)
            offsets = torch.cat([p.offsets if p.offsets is not None else torch.zeros(p.shape[0], groups) for p in parts])
        return ZeroPointTensor(GGMLTensor.concat([p.blocks for p in parts]), offsets, first.column_groups, first.input_order)
