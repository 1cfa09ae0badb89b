"""GGML weights moved into ember's eight-row interleaved layouts (Q4_0_X8, ..., Q6_K_X8) and back.

The few-row int8 product over plain GGML rows is compute-bound on CPUs without wide integer units: each
block of each row costs its own decode, dot product, reduction and scale. Stored eight rows at a time,
block k of rows 8g..8g+7 side by side, one block of all eight rows gives a vector of eight sums
(ggml_source.c, x8_group_q4_q5_body / x8_group_k_body). The move is a byte permutation: same bytes, same
size, exact both ways, so a layer can hold the interleaved form and give the GGUF form back on demand.

A plain block is cut into parts (`Part`: a byte range of the block); one group's block k stores part after
part, each part's bytes for the eight rows side by side, in row order. Q4_0: d | codes. Q4_1: d | m | codes.
Q5_0: d | high bits | codes. Q5_1: d | m | high bits | codes. Q4_K: d | dmin | the 12 scale bytes as three
4-byte words | the 128 code bytes. Q5_K: as Q4_K, with its 32 bytes of fifth bits before the codes. Q6_K: its
low nibbles, high bit pairs and int8 scales (bytes 0-207) in 4-byte words | d. Q2_K: scale/min nibbles and codes
(bytes 0-79) in words | d | dmin. Q3_K: high bits, codes and scales (bytes 0-107) in words | d. Codes and
fifth bits go in 4-byte parts, so a 32-byte load holds four bytes of every row, one row per 32-bit lane, and
the kernels' dot products leave each row's sum in its own lane with no reduction across lanes. Q8_0: d |
codes, in 4-byte parts too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ember.quant.ggml.blocks import FORMATS, GGMLFormat, GGMLTensor

ROWS_PER_GROUP = 8


@dataclass(frozen=True)
class Part:
    """Bytes [start, stop) of a plain block, stored for the eight rows of a group side by side."""

    start: int
    stop: int


def _parts(*ranges: tuple[int, int]) -> tuple[Part, ...]:
    return tuple(Part(a, b) for a, b in ranges)


def _words(start: int, stop: int) -> tuple[tuple[int, int], ...]:
    """Bytes [start, stop) of a block in 4-byte parts (a 32-byte load: one row per 32-bit lane)."""
    return tuple((at, at + 4) for at in range(start, stop, 4))


_K_FIELDS = ((0, 2), (2, 4), (4, 8), (8, 12), (12, 16))  # d, dmin, the 12 scale bytes as three 32-bit words

LAYOUTS: dict[str, tuple[GGMLFormat, tuple[Part, ...]]] = {
    "Q4_0": (GGMLFormat("Q4_0_X8", 102, 32, 18), _parts((0, 2), *_words(2, 18))),
    "Q4_1": (GGMLFormat("Q4_1_X8", 103, 32, 20), _parts((0, 2), (2, 4), *_words(4, 20))),
    "Q5_0": (GGMLFormat("Q5_0_X8", 106, 32, 22), _parts((0, 2), *_words(2, 22))),
    "Q5_1": (GGMLFormat("Q5_1_X8", 107, 32, 24), _parts((0, 2), (2, 4), *_words(4, 24))),
    "Q8_0": (GGMLFormat("Q8_0_X8", 108, 32, 34), _parts((0, 2), *_words(2, 34))),
    "Q4_K": (GGMLFormat("Q4_K_X8", 112, 256, 144), _parts(*_K_FIELDS, *_words(16, 144))),
    "Q5_K": (GGMLFormat("Q5_K_X8", 113, 256, 176), _parts(*_K_FIELDS, *_words(16, 176))),
    "Q6_K": (GGMLFormat("Q6_K_X8", 114, 256, 210), _parts(*_words(0, 208), (208, 210))),
    "Q2_K": (GGMLFormat("Q2_K_X8", 110, 256, 84), _parts(*_words(0, 80), (80, 82), (82, 84))),
    "Q3_K": (GGMLFormat("Q3_K_X8", 111, 256, 110), _parts(*_words(0, 108), (108, 110))),
}
INTERLEAVED_FORMATS: dict[str, GGMLFormat] = {name: fmt for name, (fmt, _) in LAYOUTS.items()}
PLAIN_FORMATS: dict[str, GGMLFormat] = {f.name: FORMATS[name] for name, f in INTERLEAVED_FORMATS.items()}


def is_interleaved(weight: GGMLTensor) -> bool:
    """Whether `weight` is in an eight-row interleaved layout."""
    return weight.format.name in PLAIN_FORMATS


def can_interleave(weight: GGMLTensor) -> bool:
    """Whether `weight` has an interleaved layout: a format of LAYOUTS in whole groups of eight rows."""
    return weight.format.name in INTERLEAVED_FORMATS and weight.shape[0] % ROWS_PER_GROUP == 0


def interleaved(weight: GGMLTensor) -> GGMLTensor:
    """`weight` (a format of LAYOUTS, rows a multiple of 8) in its interleaved layout: a new tensor of the same size."""
    if not can_interleave(weight):
        raise ValueError(f"only {' / '.join(LAYOUTS)} weights with a multiple of {ROWS_PER_GROUP} rows interleave; got "
                         f"{weight.format.name} {list(weight.shape)}")
    fmt, parts = LAYOUTS[weight.format.name]
    groups = _grouped(weight)  # [groups, 8 rows, blocks, block bytes]
    moved = []
    for part in parts:
        piece = groups[..., part.start : part.stop]
        moved.append(piece.permute(0, 2, 1, 3).reshape(groups.shape[0], groups.shape[2], -1))  # [g, blocks, 8 * bytes]
    stacked = torch.cat(moved, dim=-1)
    return GGMLTensor(stacked.reshape(weight.data.shape).contiguous(), fmt, weight.cols)


def plain(weight: GGMLTensor) -> GGMLTensor:
    """`weight` in its GGUF layout (itself when it is not interleaved)."""
    if not is_interleaved(weight):
        return weight
    plain_format = PLAIN_FORMATS[weight.format.name]
    rows, row_bytes = weight.data.shape
    blocks = row_bytes // weight.format.block_bytes
    stored = weight.data.reshape(rows // ROWS_PER_GROUP, blocks, ROWS_PER_GROUP * weight.format.block_bytes)
    pieces, at = [], 0
    for part in LAYOUTS[plain_format.name][1]:
        width = part.stop - part.start
        pieces.append(stored[..., at : at + width * ROWS_PER_GROUP].reshape(-1, blocks, ROWS_PER_GROUP, width))
        at += width * ROWS_PER_GROUP
    rows_first = torch.cat(pieces, dim=-1).permute(0, 2, 1, 3)  # [groups, 8 rows, blocks, block bytes]
    return GGMLTensor(rows_first.reshape(rows, row_bytes).contiguous(), plain_format, weight.cols)


def rows_of(weight: GGMLTensor, index: torch.Tensor) -> GGMLTensor:
    """The rows at `index` in the GGUF layout, whichever layout `weight` is held in: a tied embedding's lookup and the
    LM head's exact recomputation read interleaved blocks (each row's bytes gathered out of its group's blocks)."""
    if not is_interleaved(weight):
        return weight.rows(index)
    rows, row_bytes = weight.data.shape
    chunk = ROWS_PER_GROUP * weight.format.block_bytes  # one block of a group's eight rows
    groups = weight.data.view(rows // ROWS_PER_GROUP, row_bytes // weight.format.block_bytes, chunk)
    lanes = _lane_bytes(weight.format.name)[index % ROWS_PER_GROUP]  # [n, block bytes]
    picked = groups[index // ROWS_PER_GROUP].gather(2, lanes[:, None, :].expand(-1, groups.shape[1], -1))
    return GGMLTensor(picked.reshape(index.numel(), row_bytes), PLAIN_FORMATS[weight.format.name], weight.cols)


@functools.cache
def _lane_bytes(interleaved_name: str) -> torch.Tensor:
    """[8, block bytes]: where byte b of row r's block sits in its group's interleaved block (int64, for gather)."""
    plain_format = PLAIN_FORMATS[interleaved_name]
    where = torch.empty(ROWS_PER_GROUP, plain_format.block_bytes, dtype=torch.int64)
    at = 0
    for part in LAYOUTS[plain_format.name][1]:
        width = part.stop - part.start
        for row in range(ROWS_PER_GROUP):
            where[row, part.start : part.stop] = torch.arange(at + row * width, at + (row + 1) * width)
        at += width * ROWS_PER_GROUP
    return where


def _grouped(weight: GGMLTensor) -> torch.Tensor:
    rows, row_bytes = weight.data.shape
    return weight.data.reshape(rows // ROWS_PER_GROUP, ROWS_PER_GROUP, row_bytes // weight.format.block_bytes, weight.format.block_bytes)
