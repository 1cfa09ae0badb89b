"""The Python faces of the Triton kernels: check the layout, size the grid, launch (see the package docstring).

Each function takes tensors on one device (CUDA, or CPU under TRITON_INTERPRET=1) and returns new
tensors there, except `rotary_` which rotates in place as the CPU op does.
"""

from __future__ import annotations

import torch
import triton

from ember.layers.triton_kernels.attention_kernel import (
    combine_splits_kernel,
    paged_attention_kernel,
)
from ember.layers.triton_kernels.elementwise_kernels import rms_norm_kernel, rotary_kernel

# Keys one attention program scores per step: a tile of tl.dot, whatever the cache's block size.
KEY_TILE = 32
# Query rows (times the heads of one KV group) one prefill program holds; decode programs hold one row.
PREFILL_QUERY_TILE = 16
CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A decode splits its keys when it has fewer (sequence, KV head) programs than this: about one per SM of a GPU.
SPLIT_BELOW_PROGRAMS = 128
MAX_SPLITS = 16
MIN_KEYS_PER_SPLIT = 128


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
    num_splits: int | None = None,
) -> torch.Tensor:
    """query [T, H, D] over kv_cache [2, blocks, block_size, H_kv, D] -> [T, H, D] in the query's dtype.

    The arguments are `PagedBatch`'s (ember.layers.cpu_attention), on the query's device: sequence s owns
    query rows `query_starts[s] ..+ query_counts[s]`, the last `query_counts[s]` of its `context_lens[s]`
    positions, and reads its keys through row s of `block_tables` (int32, -1 where a block was given back
    behind a window or is padding). Decode (one row per sequence), a prefill over a cached prefix and a
    fresh prompt are the same kernel; `max_query_count` (the largest query_counts, known to the caller
    without a device sync) sizes the grid. `num_splits` (a power of two; None: chosen from the batch's size) splits
    a decode's keys between that many programs.
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
    max_keys = block_tables.shape[1] * block_size  # a bound on every context, known without reading context_lens
    if num_splits is None:
        num_splits = _decode_splits(num_seqs * num_kv_heads, max_keys) if query_tile == 1 else 1
    if num_splits > 1 and (query_tile != 1 or num_splits & (num_splits - 1)):
        raise ValueError(f"num_splits={num_splits}: keys split only for decode (one query per sequence), in powers of two")
    head_dim_padded = max(16, triton.next_power_of_2(head_dim))
    keys_per_split = triton.cdiv(triton.cdiv(max_keys, num_splits), KEY_TILE) * KEY_TILE
    partial_out = partial_lse = out  # unused (never dereferenced) without splits
    if num_splits > 1:
        partial_lse = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=query.device)
        partial_out = torch.empty(num_tokens, num_heads, num_splits, head_dim_padded, dtype=torch.float32,
                                  device=query.device)
    third_axis = num_splits if num_splits > 1 else triton.cdiv(max(max_query_count, 1), query_tile)
    paged_attention_kernel[(num_seqs, num_kv_heads, third_axis)](
        query, out, partial_out, partial_lse, kv_cache, block_tables, query_starts, query_counts, context_lens,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), kv_cache.stride(0), block_tables.stride(0),
        scale, 0.0 if logit_softcap is None else float(logit_softcap), sliding_window or 0, keys_per_split,
        NUM_SPLITS=num_splits, HEAD_DIM=head_dim, HEAD_DIM_PADDED=head_dim_padded, GROUP=group,
        QUERY_TILE=query_tile, ROWS=rows_per_program, KEY_TILE=KEY_TILE, BLOCK_SIZE=block_size,
        NUM_KV_HEADS=num_kv_heads, HAS_SOFTCAP=logit_softcap is not None, HAS_WINDOW=sliding_window is not None,
        IN_FLOAT32=query.dtype == torch.float32 or query.device.type == "cpu",
    )
    if num_splits > 1:
        combine_splits_kernel[(num_tokens, num_heads)](
            out, partial_out, partial_lse, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, NUM_SPLITS=num_splits, HEAD_DIM=head_dim, HEAD_DIM_PADDED=head_dim_padded,
        )
    return out


def _decode_splits(num_programs: int, max_keys: int) -> int:
    """Key splits per decode sequence: enough programs to fill a GPU, at least MIN_KEYS_PER_SPLIT keys each."""
    if num_programs >= SPLIT_BELOW_PROGRAMS:
        return 1
    wanted = triton.next_power_of_2(triton.cdiv(SPLIT_BELOW_PROGRAMS, num_programs))
    by_keys = max(1, max_keys // MIN_KEYS_PER_SPLIT)
    return min(wanted, MAX_SPLITS, 1 << (by_keys.bit_length() - 1))


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
