"""Group-wise integer grids whose values are exactly what GGML blocks decode to.

Every method of `ember quantize` (RTN, GPTQ, AWQ) ends on one of these grids, so its output runs
on the same compiled kernels as a GGUF file and is written as GGUF blocks:

- 4-bit asymmetric -> Q4_1: value = d * q + m, q in 0..15;
- 4-bit symmetric  -> Q4_0: value = d * (q - 8);
- 8-bit symmetric  -> Q8_0: value = q * d, q in -127..127.

A group of `group_size` columns (a multiple of 32) shares one (d, m); each 32-value block of the
group repeats it. d and m are rounded to float16 before any weight is rounded, so the values a
method optimises against are bit for bit the values the kernels compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ember.quant.ggml.blocks import FORMATS, GGMLFormat, GGMLTensor

BLOCK = 32


@dataclass(frozen=True)
class BlockGrid:
    """bits (4 or 8), columns per (d, m) group, and symmetric or not (4-bit only)."""

    bits: int
    group_size: int
    symmetric: bool = False

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"--bits {self.bits} is not available: the block kernels take 4 or 8 bits")
        if self.group_size < BLOCK or self.group_size % BLOCK:
            raise ValueError(f"--group-size {self.group_size} cannot run: groups must be a multiple of {BLOCK} columns (e.g. 32, 64, 128)")

    @property
    def format(self) -> GGMLFormat:
        if self.bits == 8:
            return FORMATS["Q8_0"]
        return FORMATS["Q4_0" if self.symmetric else "Q4_1"]

    def check_width(self, cols: int, name: str) -> None:
        if cols % BLOCK:
            raise ValueError(f"{name} has {cols} input columns, not a multiple of {BLOCK}: the block kernels cannot take it")

    def fit(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(d, m), float32 holding float16 values, each [rows, num_groups], from the range of each group."""
        rows, cols = weight.shape
        groups = -(-cols // self.group_size)
        padded = torch.nn.functional.pad(weight, (0, groups * self.group_size - cols), value=float("nan"))
        shaped = padded.reshape(rows, groups, self.group_size)
        high = torch.nan_to_num(shaped, nan=float("-inf")).amax(dim=2)
        low = torch.nan_to_num(shaped, nan=float("inf")).amin(dim=2)
        if self.bits == 8:
            d = torch.maximum(high.abs(), low.abs()) / 127
            return _half(d), torch.zeros_like(d)
        if self.symmetric:  # llama.cpp's choice: the value of largest magnitude maps to q - 8 = -8
            extreme = torch.where(high.abs() > low.abs(), high, low)
            return _half(extreme / -8), torch.zeros_like(extreme)
        return _half((high - low) / 15), _half(low)

    def quantize(self, weight: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """Integer codes (as float32) of `weight` on the grid (d, m) given per column or broadcastable."""
        inverse = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
        if self.bits == 8:
            return torch.round(weight * inverse).clamp(-127, 127)
        if self.symmetric:
            return (torch.round(weight * inverse) + 8).clamp(0, 15)
        return torch.round((weight - m) * inverse).clamp(0, 15)

    def dequantize(self, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """The values the kernels decode from `codes`: the same float32 operations as the block decoder."""
        if self.bits == 8:
            return codes * d
        if self.symmetric:
            return d * (codes - 8)
        return d * codes + m

    def per_column(self, values: torch.Tensor, cols: int) -> torch.Tensor:
        """[rows, num_groups] -> [rows, cols]: each group's value repeated over its columns."""
        return values.repeat_interleave(self.group_size, dim=1)[:, :cols]

    def fake_quantize(self, weight: torch.Tensor) -> torch.Tensor:
        """Round to nearest on this grid: the float weights RTN would run with."""
        d, m = self.fit(weight)
        cols = weight.shape[1]
        d, m = self.per_column(d, cols), self.per_column(m, cols)
        return self.dequantize(self.quantize(weight, d, m), d, m)

    def round_to_blocks(self, weight: torch.Tensor, d: torch.Tensor | None = None, m: torch.Tensor | None = None) -> GGMLTensor:
        """`weight` rounded to nearest under per-group (d, m) [rows, groups] (None: the groups' own ranges), as blocks."""
        weight = weight.detach().float()
        if d is None or m is None:
            d, m = self.fit(weight)
        cols = weight.shape[1]
        return self.to_blocks(self.quantize(weight, self.per_column(d, cols), self.per_column(m, cols)), d, m)

    def to_blocks(self, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> GGMLTensor:
        """Pack integer codes [rows, cols] with per-group (d, m) into this grid's GGML blocks."""
        rows, cols = codes.shape
        self.check_width(cols, "the weight")
        per_block = self.group_size // BLOCK
        d16 = d.repeat_interleave(per_block, dim=1)[:, : cols // BLOCK].to(torch.float16).reshape(-1, 1)
        m16 = m.repeat_interleave(per_block, dim=1)[:, : cols // BLOCK].to(torch.float16).reshape(-1, 1)
        q = codes.to(torch.int16).reshape(-1, BLOCK)
        fields = [d16.view(torch.uint8)]
        if self.bits == 8:
            fields.append(q.to(torch.int8).view(torch.uint8))
        else:
            if not self.symmetric:
                fields.append(m16.view(torch.uint8))
            fields.append((q[:, :16] | (q[:, 16:] << 4)).to(torch.uint8))
        blocks = torch.cat(fields, dim=1)
        return GGMLTensor(blocks.reshape(rows, -1), self.format, cols)


def _half(values: torch.Tensor) -> torch.Tensor:
    """Round to float16 (the blocks' field type) and back: scales the kernels will see exactly."""
    return values.to(torch.float16).float()
