"""Weight-only formats with float codes: NF4 (QLoRA's NormalFloat-4) and FP8 (e4m3), as blocks.

Both are stored as `GGMLTensor`s of ember's own block formats, so they load, fuse, split and run
through the same layers and compiled kernels as the GGUF formats:

- NF4: 64 values share an fp16 absmax scale d; each value is the nearest of the 16 NormalFloat
  levels to w / d (levels of a unit normal's quantiles, the information-optimal 4-bit code for
  normally distributed weights). 34 bytes per 64 values: 4.25 bits.
- FP8: 32 values share a power-of-two scale 2^s (an E8M0 byte, as in OCP's MXFP8 block), with s
  the smallest exponent that keeps max|w| / 2^s within e4m3's 448; each value is w / 2^s rounded
  to e4m3 (round to nearest even, torch's float8_e4m3fn conversion). 33 bytes per 32 values.
"""

from __future__ import annotations

import torch

from ember.quant.ggml.blocks import FORMATS, NF4_LEVELS, GGMLTensor

E4M3_MAX = 448.0


def quantize_nf4(weight: torch.Tensor) -> GGMLTensor:
    """[rows, cols] float weight (cols a multiple of 64) -> NF4 blocks."""
    rows, cols = _checked(weight, "NF4")
    blocks = weight.detach().float().reshape(rows, cols // 64, 64)
    d = blocks.abs().amax(dim=-1, keepdim=True).to(torch.float16)
    d32 = d.float()
    normalized = blocks * torch.where(d32 > 0, 1.0 / d32, torch.zeros_like(d32))
    levels = torch.tensor(NF4_LEVELS, dtype=torch.float32)
    codes = torch.bucketize(normalized, (levels[1:] + levels[:-1]) / 2).to(torch.uint8)  # nearest level
    packed = codes[..., :32] | (codes[..., 32:] << 4)
    data = torch.cat([d.view(torch.uint8), packed], dim=-1)
    return GGMLTensor(data.reshape(rows, -1), FORMATS["NF4"], cols)


def quantize_fp8(weight: torch.Tensor) -> GGMLTensor:
    """[rows, cols] float weight (cols a multiple of 32) -> FP8 (e4m3 + E8M0 scale) blocks."""
    rows, cols = _checked(weight, "FP8")
    blocks = weight.detach().float().reshape(rows, cols // 32, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    exponent = torch.ceil(torch.log2(amax.clamp(min=torch.finfo(torch.float32).tiny) / E4M3_MAX))
    exponent = exponent + (amax / torch.exp2(exponent) > E4M3_MAX).float()  # log2 may round down at a power of two
    exponent = exponent.clamp(-126, 127)
    codes = (blocks / torch.exp2(exponent)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    data = torch.cat([(exponent + 127).to(torch.uint8), codes], dim=-1)
    return GGMLTensor(data.reshape(rows, -1), FORMATS["FP8"], cols)


def _checked(weight: torch.Tensor, name: str) -> tuple[int, int]:
    rows, cols = weight.shape
    block = FORMATS[name].block_values
    if cols % block:
        raise ValueError(f"{name} needs input widths that are multiples of {block}; this weight has {cols} columns")
    return rows, cols
