"""Q4_0 / Q4_1 weights moved into ember's eight-row interleaved layouts (Q4_0_X8, Q4_1_X8) and back.

The few-row int8 product over plain GGML rows is compute-bound on CPUs without wide integer units: each
32-value block of each row costs its own decode, dot product, reduction and scale. Stored eight rows at a
time, block k of rows 8g..8g+7 side by side, one block of all eight rows reduces to one vector of eight
sums (ggml_source.c, x8_group_int8_body). The move is a byte permutation: same bytes, same size, exact both
ways, so a layer can hold the interleaved form and give the GGUF form back on demand. Layout of one group's
block k (8 * block_bytes bytes): the eight fp16 scales in lane order LANE_ROW, for Q4_1 the eight fp16 mins
in the same order, then the eight rows' 16 code bytes in row order.
"""

from __future__ import annotations

import torch

from ember.quant.ggml_blocks import FORMATS, GGMLFormat, GGMLTensor

ROWS_PER_GROUP = 8
LANE_ROW = (0, 2, 4, 6, 1, 3, 5, 7)  # the row whose sum lands in each lane of the C kernel's reduction
ROW_LANE = tuple(LANE_ROW.index(row) for row in range(ROWS_PER_GROUP))
INTERLEAVED_FORMATS: dict[str, GGMLFormat] = {
    "Q4_0": GGMLFormat("Q4_0_X8", 102, 32, 18),
    "Q4_1": GGMLFormat("Q4_1_X8", 103, 32, 20),
}
PLAIN_FORMATS: dict[str, GGMLFormat] = {f.name: FORMATS[plain] for plain, f in INTERLEAVED_FORMATS.items()}
_CODE_BYTES = 16  # a 32-value block's nibbles


def is_interleaved(weight: GGMLTensor) -> bool:
    """Whether `weight` is in an eight-row interleaved layout."""
    return weight.format.name in PLAIN_FORMATS


def can_interleave(weight: GGMLTensor) -> bool:
    """Whether `weight` has an interleaved layout: Q4_0 / Q4_1 with whole groups of eight rows."""
    return weight.format.name in INTERLEAVED_FORMATS and weight.shape[0] % ROWS_PER_GROUP == 0


def interleaved(weight: GGMLTensor) -> GGMLTensor:
    """`weight` (Q4_0 / Q4_1, rows a multiple of 8) in its interleaved layout: a new tensor of the same size."""
    if not can_interleave(weight):
        raise ValueError(f"only Q4_0 / Q4_1 weights with a multiple of {ROWS_PER_GROUP} rows interleave; got "
                         f"{weight.format.name} {list(weight.shape)}")
    fields = weight.format.block_bytes - _CODE_BYTES
    groups = _grouped(weight)  # [groups, 8 rows, blocks, block bytes]
    scales = groups[..., :fields].index_select(1, torch.tensor(LANE_ROW))
    parts = [scales[..., 2 * f : 2 * f + 2].permute(0, 2, 1, 3) for f in range(fields // 2)]  # each [g, blocks, 8, 2]
    parts.append(groups[..., fields:].permute(0, 2, 1, 3))  # [g, blocks, 8, 16]
    moved = torch.cat([p.reshape(p.shape[0], p.shape[1], -1) for p in parts], dim=-1)
    return GGMLTensor(moved.reshape(weight.data.shape).contiguous(), INTERLEAVED_FORMATS[weight.format.name], weight.cols)


def plain(weight: GGMLTensor) -> GGMLTensor:
    """`weight` in its GGUF layout (itself when it is not interleaved)."""
    if not is_interleaved(weight):
        return weight
    fields = weight.format.block_bytes - _CODE_BYTES
    rows, row_bytes = weight.data.shape
    blocks = row_bytes // weight.format.block_bytes
    stored = weight.data.reshape(rows // ROWS_PER_GROUP, blocks, ROWS_PER_GROUP * weight.format.block_bytes)
    lanes = ROWS_PER_GROUP * 2
    parts = [stored[..., lanes * f : lanes * (f + 1)].reshape(-1, blocks, ROWS_PER_GROUP, 2).index_select(2, torch.tensor(ROW_LANE))
             for f in range(fields // 2)]
    parts.append(stored[..., lanes * (fields // 2) :].reshape(-1, blocks, ROWS_PER_GROUP, _CODE_BYTES))
    rows_first = torch.cat(parts, dim=-1).permute(0, 2, 1, 3)  # [groups, 8 rows, blocks, block bytes]
    return GGMLTensor(rows_first.reshape(rows, row_bytes).contiguous(), PLAIN_FORMATS[weight.format.name], weight.cols)


def _grouped(weight: GGMLTensor) -> torch.Tensor:
    rows, row_bytes = weight.data.shape
    return weight.data.reshape(rows // ROWS_PER_GROUP, ROWS_PER_GROUP, row_bytes // weight.format.block_bytes, weight.format.block_bytes)
