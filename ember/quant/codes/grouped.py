"""Integer codes with per-group zero points and scales (GPTQ, AWQ, compressed-tensors' packed ints) as ember's blocks.

The value of weight[o, i] is scales[g, o] * (codes[o, i] - zeros[g, o]) with g = groups[i]. Where the
groups cover whole 32-value blocks the weight becomes a `ZeroPointTensor` (Q4_0 / Q8_0 blocks plus exact
zero-point offsets); else it stays float32 (exact) and a warning says so. Shared by the readers of
ember.quant.hf.gptq_awq and ember.quant.hf.scaled.
"""

from __future__ import annotations

import logging

import torch

from ember.quant.codes.grid import BLOCK, BlockGrid
from ember.quant.ggml.blocks import GGMLTensor
from ember.quant.ggml.zero_point import ZeroPointTensor

logger = logging.getLogger(__name__)


def grouped_weight(bits: int, codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, groups: torch.Tensor,
                   module: str) -> torch.Tensor | ZeroPointTensor:
    """scales[g, o] * (codes[o, i] - zeros[g, o]) with g = groups[i] (codes unsigned, scales float16): a
    ZeroPointTensor, or float32 where the groups do not cover whole blocks."""
    cols = codes.shape[1]
    is_sorted = bool((groups[1:] >= groups[:-1]).all())
    order = None if is_sorted else torch.argsort(groups, stable=True)
    stored_groups = groups if order is None else groups[order]
    if cols % BLOCK or not bool((stored_groups.reshape(-1, BLOCK) == stored_groups.reshape(-1, BLOCK)[:, :1]).all()):
        logger.warning("%s: its groups do not cover whole %d-value blocks; this layer runs in float32", module, BLOCK)
        return dequantize_reference(codes, zeros, scales, groups)
    return _zero_point_tensor(bits, codes, zeros, scales, stored_groups, order)


def unpack_words(words: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """int32 [r, c] words, 32 / bits values each (lowest bits first) -> int32 [r, c * 32 / bits] along the last dim,
    the values of each word taken at positions `order` (AWQ) or in position order."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    values = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # arithmetic shift; the mask drops the sign
    if order is not None:
        values = values[..., list(order)]
    return values.reshape(words.shape[0], words.shape[1] * per_word)


def dequantize_reference(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """float32 [out, in]: scales[g, o] * (codes[o, i] - zeros[g, o]) with g = groups[i] (exact in float32)."""
    return scales.float()[groups].t() * (codes - zeros[groups].t()).float()


def _zero_point_tensor(bits: int, codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, stored_groups: torch.Tensor,
                       order: torch.Tensor | None) -> ZeroPointTensor:
    center = 1 << (bits - 1)  # Q4_0 decodes d * (q - 8); Q8_0 holds q - 128 as int8
    if order is not None:
        codes = codes[:, order]
    block_scales = scales[stored_groups[::BLOCK]].t().float()  # [out, blocks]: each block's group scale
    stored_codes = codes if bits == 4 else codes - center
    blocks: GGMLTensor = BlockGrid(bits, BLOCK, symmetric=True).to_blocks(stored_codes, block_scales, torch.zeros_like(block_scales))
    offsets = (scales.float() * (center - zeros).float()).t().contiguous()  # [out, groups]
    return ZeroPointTensor(blocks, None if not bool(offsets.any()) else offsets, stored_groups.contiguous(), order)
