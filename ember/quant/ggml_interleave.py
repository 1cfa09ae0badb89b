"""Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights moved into ember's eight-row interleaved layouts (Q4_0_X8, ...) and back.

The few-row int8 product over plain GGML rows is compute-bound on CPUs without wide integer units: each
32-value block of each row costs its own decode, dot product, reduction and scale. Stored eight rows at a
time, block k of rows 8g..8g+7 side by side, one block of all eight rows reduces to one vector of eight
sums (ggml_source.c, x8_group_int8_body). The move is a byte permutation: same bytes, same size, exact both
ways, so a layer can hold the interleaved form and give the GGUF form back on demand. Layout of one group's
block k (8 * block_bytes bytes): the eight fp16 scales in lane order (LANE_ROW; rows in order for Q8_0, whose
kernel reduces a row per vector), for Q4_1 / Q5_1 the eight fp16 mins in the same order, for Q5 the eight rows'
4 bytes of high bits in row order, then the eight rows' code bytes (16 nibble bytes; Q8_0: 32 int8) in row order.
"""

from __future__ import annotations

import torch

from ember.quant.ggml_blocks import FORMATS, GGMLFormat, GGMLTensor

ROWS_PER_GROUP = 8
LANE_ROW = (0, 2, 4, 6, 1, 3, 5, 7)  # the row whose sum lands in each lane of the C kernel's reduction
INTERLEAVED_FORMATS: dict[str, GGMLFormat] = {
    "Q4_0": GGMLFormat("Q4_0_X8", 102, 32, 18),
    "Q4_1": GGMLFormat("Q4_1_X8", 103, 32, 20),
    "Q5_0": GGMLFormat("Q5_0_X8", 106, 32, 22),
    "Q5_1": GGMLFormat("Q5_1_X8", 107, 32, 24),
    "Q8_0": GGMLFormat("Q8_0_X8", 108, 32, 34),
}
PLAIN_FORMATS: dict[str, GGMLFormat] = {f.name: FORMATS[plain] for plain, f in INTERLEAVED_FORMATS.items()}
_CODE_BYTES = {"Q8_0": 32}  # a 32-value block's code bytes: 16 of nibbles unless named
_HIGH_BYTES = {"Q5_0": 4, "Q5_1": 4}  # bytes of fifth bits per block, between the fp16 fields and the nibbles


def is_interleaved(weight: GGMLTensor) -> bool:
    """Whether `weight` is in an eight-row interleaved layout."""
    return weight.format.name in PLAIN_FORMATS


def can_interleave(weight: GGMLTensor) -> bool:
    """Whether `weight` has an interleaved layout: Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 in whole groups of eight rows."""
    return weight.format.name in INTERLEAVED_FORMATS and weight.shape[0] % ROWS_PER_GROUP == 0


def interleaved(weight: GGMLTensor) -> GGMLTensor:
    """`weight` (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0, rows a multiple of 8) in its interleaved layout: a new tensor of the same size."""
    if not can_interleave(weight):
        raise ValueError(f"only Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights with a multiple of {ROWS_PER_GROUP} rows interleave; got "
                         f"{weight.format.name} {list(weight.shape)}")
    halves, parts = _layout(weight.format.name)
    groups = _grouped(weight)  # [groups, 8 rows, blocks, block bytes]
    scales = groups[..., : 2 * halves].index_select(1, torch.tensor(_lane_rows(weight.format.name)))
    moved = [scales[..., 2 * h : 2 * h + 2].permute(0, 2, 1, 3) for h in range(halves)]  # each [g, blocks, 8, 2]
    moved += [groups[..., start:stop].permute(0, 2, 1, 3) for start, stop in parts]  # each [g, blocks, 8, bytes]
    stacked = torch.cat([p.reshape(p.shape[0], p.shape[1], -1) for p in moved], dim=-1)
    return GGMLTensor(stacked.reshape(weight.data.shape).contiguous(), INTERLEAVED_FORMATS[weight.format.name], weight.cols)


def plain(weight: GGMLTensor) -> GGMLTensor:
    """`weight` in its GGUF layout (itself when it is not interleaved)."""
    if not is_interleaved(weight):
        return weight
    plain_format = PLAIN_FORMATS[weight.format.name]
    halves, parts = _layout(plain_format.name)
    rows, row_bytes = weight.data.shape
    blocks = row_bytes // weight.format.block_bytes
    stored = weight.data.reshape(rows // ROWS_PER_GROUP, blocks, ROWS_PER_GROUP * weight.format.block_bytes)
    pieces, at = [], 0
    for _ in range(halves):
        lanes = stored[..., at : at + 2 * ROWS_PER_GROUP].reshape(-1, blocks, ROWS_PER_GROUP, 2)
        row_lanes = [_lane_rows(plain_format.name).index(row) for row in range(ROWS_PER_GROUP)]
        pieces.append(lanes.index_select(2, torch.tensor(row_lanes)))
        at += 2 * ROWS_PER_GROUP
    for start, stop in parts:
        width = stop - start
        pieces.append(stored[..., at : at + width * ROWS_PER_GROUP].reshape(-1, blocks, ROWS_PER_GROUP, width))
        at += width * ROWS_PER_GROUP
    rows_first = torch.cat(pieces, dim=-1).permute(0, 2, 1, 3)  # [groups, 8 rows, blocks, block bytes]
    return GGMLTensor(rows_first.reshape(rows, row_bytes).contiguous(), plain_format, weight.cols)


def _layout(name: str) -> tuple[int, list[tuple[int, int]]]:
    """A plain format's fp16 fields (1 or 2) and its row-order parts as byte ranges of a block (high bits, nibbles)."""
    halves = 2 if name in ("Q4_1", "Q5_1") else 1
    high = _HIGH_BYTES.get(name, 0)
    parts = [(2 * halves, 2 * halves + high)] if high else []
    return halves, [*parts, (2 * halves + high, 2 * halves + high + _CODE_BYTES.get(name, 16))]


def _lane_rows(name: str) -> tuple[int, ...]:
    """The row each lane's scale belongs to, for a plain format's interleaved layout."""
    return tuple(range(ROWS_PER_GROUP)) if name == "Q8_0" else LANE_ROW


def _grouped(weight: GGMLTensor) -> torch.Tensor:
    rows, row_bytes = weight.data.shape
    return weight.data.reshape(rows // ROWS_PER_GROUP, ROWS_PER_GROUP, row_bytes // weight.format.block_bytes, weight.format.block_bytes)
