"""IQ4_NL blocks re-coded as Q8_0 blocks, exactly, so an IQ4_NL GGUF runs in ember's Q8_0 kernels.

An IQ4_NL block is Q4_0's layout (an fp16 scale d, then 16 bytes: the low nibbles index values 0..15, the high
nibbles 16..31) whose nibbles index a fixed non-uniform table of int8 levels instead of standing for q - 8. Each
value is d times its level, and a Q8_0 block is an fp16 scale and 32 int8 codes, value d times code: the same d and
the levels as codes give the same float32 products the gguf package computes. Twice the bytes of IQ4_NL (8.5 bits
per weight instead of 4.5), still a quarter of float32's.
"""

from __future__ import annotations

import numpy as np
from gguf.quants import IQ4_NL

BLOCK_VALUES = 32
IQ4_NL_BLOCK_BYTES = 18  # fp16 d + 16 bytes of nibbles
Q8_0_BLOCK_BYTES = 34  # fp16 d + 32 int8 codes
_LEVELS = np.array(IQ4_NL.kvalues, dtype=np.int8)  # the format's 16 levels, as llama.cpp defines them


def iq4_nl_rows_as_q8_0(raw: np.ndarray) -> np.ndarray:
    """uint8 [rows, blocks * 18] of IQ4_NL -> uint8 [rows, blocks * 34] of Q8_0 holding the same values."""
    rows = raw.shape[0]
    if raw.shape[1] % IQ4_NL_BLOCK_BYTES:
        raise ValueError(f"an IQ4_NL row of {raw.shape[1]} bytes is not whole {IQ4_NL_BLOCK_BYTES}-byte blocks")
    blocks = raw.reshape(rows, -1, IQ4_NL_BLOCK_BYTES)
    nibbles = blocks[..., 2:]
    codes = _LEVELS[np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=-1)]
    out = np.empty((rows, blocks.shape[1], Q8_0_BLOCK_BYTES), dtype=np.uint8)
    out[..., :2] = blocks[..., :2]
    out[..., 2:] = codes.view(np.uint8)
    return out.reshape(rows, -1)
