"""A tensor-parallel rank's part of a quantized weight, still quantized: whole blocks, whole groups.

Column-parallel layers take rows [start, stop) of a weight (output channels): every format splits there, rows
are independent. Row-parallel layers take columns [start, stop) (input channels): a GGML block (32 values, 256
for K-quants, 64 for NF4) scales its own values only, so the columns split where both ends fall on block
boundaries, and each rank rounds its activations per 32 values exactly as one process does. A GPTQ / AWQ weight
is blocks plus one offset per (row, group): a group cut in two contributes its offsets to both ranks' sums,
each over its own columns, so only the blocks must be whole. What cannot split exactly is refused, naming the
shape and the way out, never converted to float behind the user's back:

- a column cut inside a block;
- W8A8 rows (SmoothQuant): each token's int8 scale is the max over all of its columns, which no rank sees;
- an act-order GPTQ weight (`desc_act`): its columns are stored in group order, a rank's columns are scattered.

`--exact-row-parallel` splits the row layers by rows instead (whole inputs on every rank), which every format takes.
"""

from __future__ import annotations

from ember.quant.ggml.blocks import GGMLRowParts, GGMLTensor
from ember.quant.ggml.zero_point import ZeroPointTensor
from ember.quant.int8.channel import Int8ChannelTensor

QuantizedWeight = GGMLTensor | GGMLRowParts | Int8ChannelTensor | ZeroPointTensor
EXACT_ROWS_HINT = "split the row layers by rows with --exact-row-parallel, choose another --tensor-parallel-size, or load with --dtype float32"


class UnsplittableWeightError(ValueError):
    """A quantized weight whose rank part would not be the same numbers in the same format (see the module docstring)."""


def quantized_part(weight: QuantizedWeight, dim: int, start: int, stop: int, name: str) -> QuantizedWeight:
    """Rows (dim 0) or columns (dim 1) [start, stop) of `weight` (checkpoint tensor `name`), in its own format and in
    memory of its own (the whole weight can go)."""
    if dim == 0:
        return _owned(_rows(weight, start, stop, name))
    if isinstance(weight, GGMLTensor):
        return _owned(_block_columns(weight, start, stop, name))
    if isinstance(weight, ZeroPointTensor):
        return _owned(_zero_point_columns(weight, start, stop, name))
    kind = "W8A8 rows scale each token by the max over all its columns" if isinstance(weight, Int8ChannelTensor) else \
        "its row ranges keep different formats"
    raise UnsplittableWeightError(f"{name} {list(weight.shape)} cannot split its input columns [{start}, {stop}) over "
                                  f"ranks: {kind}; {EXACT_ROWS_HINT}")


def _rows(weight: QuantizedWeight, start: int, stop: int, name: str) -> QuantizedWeight:
    if isinstance(weight, GGMLTensor):
        return GGMLTensor(weight.data[start:stop], weight.format, weight.cols)
    if isinstance(weight, Int8ChannelTensor):
        return weight.row_range(start, stop)
    if isinstance(weight, ZeroPointTensor):
        offsets = None if weight.offsets is None else weight.offsets[start:stop]
        return ZeroPointTensor(_rows(weight.blocks, start, stop, name), offsets, weight.column_groups, weight.input_order)
    raise UnsplittableWeightError(f"{name} {list(weight.shape)} keeps row ranges in different formats, which a rank "
                                  f"cannot take rows [{start}, {stop}) of; load with --dtype float32")


def _block_columns(weight: GGMLTensor, start: int, stop: int, name: str) -> GGMLTensor:
    values, block_bytes = weight.format.block_values, weight.format.block_bytes
    if start % values or stop % values:
        raise UnsplittableWeightError(
            f"{name} {list(weight.shape)} in {weight.format.name} blocks of {values} values cannot split its input columns "
            f"at [{start}, {stop}): a rank's columns must be whole blocks; {EXACT_ROWS_HINT}"
        )
    return GGMLTensor(weight.data[:, start // values * block_bytes : stop // values * block_bytes], weight.format, stop - start)


def _zero_point_columns(weight: ZeroPointTensor, start: int, stop: int, name: str) -> ZeroPointTensor:
    if weight.input_order is not None:
        raise UnsplittableWeightError(f"{name} {list(weight.shape)} is act-order (desc_act): its columns are stored by group, "
                                      f"so input columns [{start}, {stop}) are not one run of blocks; {EXACT_ROWS_HINT}")
    blocks = _block_columns(weight.blocks, start, stop, name)
    groups = weight.column_groups[start:stop]
    first, last = int(groups[0]), int(groups[-1])
    offsets = None if weight.offsets is None else weight.offsets[:, first : last + 1]
    return ZeroPointTensor(blocks, offsets, groups - first, None)


def _owned(weight: QuantizedWeight) -> QuantizedWeight:
    """`weight` with its tensors copied out of the whole weight they are views of."""
    if isinstance(weight, GGMLTensor):
        return GGMLTensor(weight.data.clone(), weight.format, weight.cols)
    if isinstance(weight, ZeroPointTensor):
        offsets = None if weight.offsets is None else weight.offsets.clone()
        return ZeroPointTensor(_owned(weight.blocks), offsets, weight.column_groups.clone(), weight.input_order)
    if isinstance(weight, Int8ChannelTensor):
        return Int8ChannelTensor(weight.codes.clone(), weight.scales.clone())
    return weight
