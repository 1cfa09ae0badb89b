"""The Python faces of the Triton kernels: check the layout, size the grid, launch (see the package docstring).

Each function takes tensors on one device (CUDA, or CPU under TRITON_INTERPRET=1) and returns new
tensors there, except `rotary_` which rotates in place as the CPU op does.
"""

from __future__ import annotations

import torch
import triton

from ember.layers.triton_kernels.attention_kernel import paged_attention_kernel
from ember.layers.triton_kernels.elementwise_kernels import rms_norm_kernel, rotary_kernel

# Keys one attention program scores per step: a tile of tl.dot, whatever the cache's block size.
KEY_TILE = 32
# Query rows (times the heads of one KV group) one prefill program holds; decode programs hold one row.
PREFILL_QUERY_TILE = 16
CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_starts: torch.Tensor,
    query_counts: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    max_query_count: int | None = None,
) -> torch.Tensor:
    """query [T, H, D] over kv_cache [2, blocks, block_size, H_kv, D] -> [T, H, D] in the query's dtype.

    The arguments are `PagedBatch`'s (ember.layers.cpu_attention), on the query's device: sequence s owns
    query rows `query_starts[s] ..+ query_counts[s]`, the last `query_counts[s]` of its `context_lens[s]`
    positions, and reads its keys through row s of `block_tables` (int32, -1 where a block was given back
    behind a window or is padding). Decode (one row per sequence), a prefill over a cached prefix and a
    fresh prompt are the same kernel; `max_query_count` (the largest query_counts, known to the caller
    without a device sync) sizes the grid.
    """
    num_tokens, num_heads, head_dim = query.shape
    _, _, block_size, num_kv_heads, cache_head_dim = kv_cache.shape
    if cache_head_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"query [T, {num_heads}, {head_dim}] does not fit a cache of {num_kv_heads} heads of {cache_head_dim}")
    if kv_cache.dtype not in CACHE_DTYPES or not kv_cache.is_contiguous():
        raise ValueError(f"the Triton attention kernel reads a contiguous {CACHE_DTYPES} cache, not {kv_cache.dtype}")
    if max_query_count is None:
        max_query_count = int(query_counts.max()) if query_counts.numel() else 0
    group = num_heads // num_kv_heads
    # The products run in the query's dtype (bfloat16 / float16 on tensor cores), float32 for a float32 query and
    # under the interpreter (CPU tensors), which multiplies bfloat16 tiles wrongly in tl.dot (triton 3.9).
    query_tile = 1 if max_query_count <= 1 else PREFILL_QUERY_TILE
    # tl.dot wants every side of a tile to be at least 16, and powers of two.
    rows_per_program = max(16, triton.next_power_of_2(query_tile * group))
    out = torch.empty_like(query)
    num_seqs = block_tables.shape[0]
    grid = (num_seqs, num_kv_heads, triton.cdiv(max(max_query_count, 1), query_tile))
    paged_attention_kernel[grid](
        query, out, kv_cache, block_tables, query_starts, query_counts, context_lens,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), kv_cache.stride(0), block_tables.stride(0),
        scale, 0.0 if logit_softcap is None else float(logit_softcap), sliding_window or 0,
        HEAD_DIM=head_dim, HEAD_DIM_PADDED=max(16, triton.next_power_of_2(head_dim)), GROUP=group,
        QUERY_TILE=query_tile, ROWS=rows_per_program, KEY_TILE=KEY_TILE, BLOCK_SIZE=block_size,
        NUM_KV_HEADS=num_kv_heads, HAS_SOFTCAP=logit_softcap is not None, HAS_WINDOW=sliding_window is not None,
        IN_FLOAT32=query.dtype == torch.float32 or query.device.type == "cpu",
    )
    return out


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual) over the last dimension, in float32 inside, x's dtype out.

    Without a residual the second tensor is x itself (nothing is added or written).
    """
    hidden = x.shape[-1]
    rows = x.reshape(-1, hidden)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if residual is None:
        total = rows
    else:
        residual_rows = residual.reshape(-1, hidden).contiguous()
        total = torch.empty_like(out)
    rms_norm_kernel[(rows.shape[0],)](
        rows, residual_rows if residual is not None else rows, weight, out, total,
        rows.stride(0), hidden, eps, HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden),
    )
    return out.view(x.shape), (x if residual is None else total.view(x.shape))


def rotary_(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] in place by each token's position (half-split layout, the first `rotary_dim`
    dims; the rest pass). `cos` / `sin` are the full-width tables [positions, rotary_dim] of RotaryEmbedding.

    x may be a strided view (a fused projection's q or k) whose head dims are contiguous.
    """
    num_tokens, num_heads, head_dim = x.shape
    if x.stride(2) != 1:
        raise ValueError("rotary_ needs each head's dims contiguous (x.stride(2) == 1)")
    half = rotary_dim // 2
    rotary_kernel[(num_tokens, num_heads)](
        x, positions, cos, sin, x.stride(0), x.stride(1), cos.stride(0), HALF=half, HALF_PADDED=triton.next_power_of_2(half),
    )
    return x
