"""RMSNorm with the residual add fused, and rotary in place: one Triton program per row (per token and head).

Both compute in float32 and store in the tensors' own dtype, as the compiled CPU ops in
ember/layers/csrc/elementwise.c do for float32 activations.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(
    x, residual, weight, out, total, x_row_stride, hidden, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    values = tl.load(x + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        added = values + tl.load(residual + row * hidden + cols, mask=mask, other=0.0).to(tl.float32)
        rounded = added.to(total.dtype.element_ty)
        tl.store(total + row * hidden + cols, rounded, mask=mask)
        values = rounded.to(tl.float32)  # normalise the sum as stored, as torch's `norm(x + delta)` would
    mean_square = tl.sum(values * values, axis=0) / hidden
    normed = values * tl.rsqrt(mean_square + eps) * tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * hidden + cols, normed.to(out.dtype.element_ty), mask=mask)


@triton.jit
def rotary_kernel(
    x, positions, cos, sin, token_stride, head_stride, table_stride, HALF: tl.constexpr, HALF_PADDED: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    position = tl.load(positions + token).to(tl.int64)
    pairs = tl.arange(0, HALF_PADDED)
    mask = pairs < HALF
    base = x + token * token_stride + head * head_stride
    first = tl.load(base + pairs, mask=mask, other=0.0).to(tl.float32)
    second = tl.load(base + HALF + pairs, mask=mask, other=0.0).to(tl.float32)
    table_row = position * table_stride
    cos_first = tl.load(cos + table_row + pairs, mask=mask, other=0.0)
    cos_second = tl.load(cos + table_row + HALF + pairs, mask=mask, other=0.0)
    sin_first = tl.load(sin + table_row + pairs, mask=mask, other=0.0)
    sin_second = tl.load(sin + table_row + HALF + pairs, mask=mask, other=0.0)
    # The half-split rotation: (a, b) -> (a cos - b sin, b cos + a sin), pair i being dims i and i + HALF.
    tl.store(base + pairs, (first * cos_first - second * sin_first).to(x.dtype.element_ty), mask=mask)
    tl.store(base + HALF + pairs, (second * cos_second + first * sin_second).to(x.dtype.element_ty), mask=mask)
