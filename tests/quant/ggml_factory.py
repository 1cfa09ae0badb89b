"""Random but valid GGML blocks for tests: random quants, finite fp16 scale fields."""

from __future__ import annotations

import numpy as np
import torch

from ember.quant.ggml.blocks import FORMATS, GGMLTensor

# Byte offsets of each format's fp16 fields (scale d, and min / dmin where the format has one).
HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "NF4": (0,), "FP8": ()}


def random_blocks(name: str, rows: int, cols: int, seed: int = 0) -> GGMLTensor:
    """A [rows, cols] weight of format `name` with uniformly random bytes and scales in about [-0.05, 0.05]."""
    fmt = FORMATS[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // fmt.block_values, fmt.block_bytes), dtype=np.uint8)
    for offset in HALF_FIELDS[name]:
        halves = rng.uniform(-0.05, 0.05, size=raw.shape[:2]).astype(np.float16)
        raw[..., offset : offset + 2] = halves.view(np.uint8).reshape(*raw.shape[:2], 2)
    if name == "FP8":  # E8M0 scales near 2^-8 and e4m3 codes other than NaN (0x7F, 0xFF)
        raw[..., 0] = rng.integers(115, 125, size=raw.shape[:2])
        raw[..., 1:] = np.where((raw[..., 1:] & 0x7F) == 0x7F, raw[..., 1:] ^ 1, raw[..., 1:])
    return GGMLTensor(torch.from_numpy(raw.reshape(rows, -1).copy()), fmt, cols)
