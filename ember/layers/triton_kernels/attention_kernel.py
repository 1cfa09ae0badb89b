"""Paged attention in Triton: every query row reads its sequence's keys and values through the block table.

One program per (sequence, KV head, tile of query rows): it holds the tile's rows times the query heads
that share the KV head (GQA: each key and value is loaded once for the whole group), walks the keys in
tiles of KEY_TILE positions, looks up each position's block in the table, and keeps an online softmax
in float32. The key walk stops at the tile's last query position (causal) and starts at the first key
of the first query's window, so blocks given back behind a window (-1) are never read; a key whose
block is -1 is masked all the same.

Decode with few sequences (batch 1 has one program per KV head, too few for a GPU) splits each
sequence's keys between NUM_SPLITS programs instead (flash-decoding): each writes its rows' partial
output and log-sum-exp, and `combine_splits_kernel` merges them. The cache layout is ember's:
`[2 (keys, values), num_blocks, block_size, num_kv_heads, head_dim]`, slot = block * block_size + offset.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^2x + 1): exact at both saturations (e^2x overflows to inf, or underflows to 0), no libdevice needed.
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _dot(a, b, IN_FLOAT32: tl.constexpr):
    # float32 operands multiply in full precision (no TF32), so a float32 cache matches the CPU op.
    if IN_FLOAT32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def paged_attention_kernel(
    query, out, partial_out, partial_lse, kv_cache, block_tables, query_starts, query_counts, context_lens,
    query_token_stride, query_head_stride, out_token_stride, out_head_stride, cache_kv_stride, table_stride,
    scale, softcap, window, keys_per_split,
    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr, GROUP: tl.constexpr, QUERY_TILE: tl.constexpr,
    ROWS: tl.constexpr, KEY_TILE: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, IN_FLOAT32: tl.constexpr,
):
    sequence = tl.program_id(0)
    kv_head = tl.program_id(1)
    # The grid's third axis: key splits of a decode (one query row), else tiles of query rows.
    if NUM_SPLITS > 1:
        split = tl.program_id(2)
        first_query = 0
    else:
        split = 0
        first_query = tl.program_id(2) * QUERY_TILE
    count = tl.load(query_counts + sequence)
    start = tl.load(query_starts + sequence)
    context = tl.load(context_lens + sequence)

    # Row r of the tile: query row first_query + r // GROUP of the sequence, head kv_head * GROUP + r % GROUP.
    rows = tl.arange(0, ROWS)
    query_index = first_query + rows // GROUP
    row_valid = (rows < QUERY_TILE * GROUP) & (query_index < count)
    head = kv_head * GROUP + rows % GROUP
    query_position = context - count + query_index
    dims = tl.arange(0, HEAD_DIM_PADDED)
    dim_valid = dims < HEAD_DIM
    row_offsets = (start + query_index).to(tl.int64) * query_token_stride + head * query_head_stride
    q = tl.load(query + row_offsets[:, None] + dims[None, :], mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    if IN_FLOAT32:
        q = q.to(tl.float32)

    # Keys [low, high): up to the tile's last query (none for a tile past the sequence's rows), from its first window.
    num_rows = tl.minimum(count - first_query, QUERY_TILE)
    high = tl.where(num_rows > 0, context - count + first_query + num_rows, 0)
    low = 0
    if HAS_WINDOW:
        low = tl.maximum(context - count + first_query - window + 1, 0)
    low = (low // KEY_TILE) * KEY_TILE
    if NUM_SPLITS > 1:
        low = tl.maximum(low, split * keys_per_split)  # keys_per_split is a multiple of KEY_TILE
        high = tl.minimum(high, (split + 1) * keys_per_split)

    running_max = tl.full([ROWS], float("-inf"), tl.float32)
    running_sum = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM_PADDED], tl.float32)
    keys_in_tile = tl.arange(0, KEY_TILE)
    for key_start in range(low, high, KEY_TILE):
        key_position = key_start + keys_in_tile
        in_range = key_position < high
        block = tl.load(block_tables + sequence * table_stride + key_position // BLOCK_SIZE, mask=in_range, other=-1)
        key_valid = in_range & (block >= 0)
        slot = block.to(tl.int64) * BLOCK_SIZE + key_position % BLOCK_SIZE
        cache_offsets = slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + dims[None, :]
        cache_mask = key_valid[:, None] & dim_valid[None, :]
        k = tl.load(kv_cache + cache_offsets, mask=cache_mask, other=0.0).to(q.dtype)
        v = tl.load(kv_cache + cache_kv_stride + cache_offsets, mask=cache_mask, other=0.0).to(q.dtype)

        scores = _dot(q, tl.trans(k), IN_FLOAT32) * scale
        if HAS_SOFTCAP:
            scores = softcap * _tanh(scores / softcap)
        visible = row_valid[:, None] & key_valid[None, :] & (key_position[None, :] <= query_position[:, None])
        if HAS_WINDOW:
            visible = visible & (key_position[None, :] > query_position[:, None] - window)
        scores = tl.where(visible, scores, float("-inf"))

        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        # A row that has seen no visible key yet keeps max -inf: shift by 0 there, not by -inf (which gives NaN).
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        correction = tl.exp(running_max - shift)
        weights = tl.exp(scores - shift[:, None])
        running_sum = running_sum * correction + tl.sum(weights, axis=1)
        acc = acc * correction[:, None] + _dot(weights.to(v.dtype), v, IN_FLOAT32)
        running_max = new_max

    result = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
    store_mask = row_valid[:, None] & dim_valid[None, :]
    if NUM_SPLITS > 1:
        # Partials [tokens, heads, splits] (+ [HEAD_DIM_PADDED]); a split that saw no key has log-sum-exp -inf.
        partial = ((start + query_index).to(tl.int64) * (GROUP * NUM_KV_HEADS) + head) * NUM_SPLITS + split
        lse = tl.where(running_sum > 0, running_max + tl.log(tl.where(running_sum > 0, running_sum, 1.0)), float("-inf"))
        tl.store(partial_lse + partial, lse, mask=row_valid)
        tl.store(partial_out + partial[:, None] * HEAD_DIM_PADDED + dims[None, :], result, mask=store_mask)
    else:
        out_offsets = (start + query_index).to(tl.int64) * out_token_stride + head * out_head_stride
        tl.store(out + out_offsets[:, None] + dims[None, :], result.to(out.dtype.element_ty), mask=store_mask)


@triton.jit
def combine_splits_kernel(
    out, partial_out, partial_lse, out_token_stride, out_head_stride,
    NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PADDED: tl.constexpr,
):
    """out[token, head] = the splits' outputs weighted by exp(log-sum-exp), one program per (token, head)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, HEAD_DIM_PADDED)
    partial = (token * NUM_HEADS + head) * NUM_SPLITS + splits
    lse = tl.load(partial_lse + partial)
    top = tl.max(lse, axis=0)
    weights = tl.exp(lse - tl.where(top == float("-inf"), 0.0, top))
    outputs = tl.load(partial_out + partial[:, None] * HEAD_DIM_PADDED + dims[None, :])
    merged = tl.sum(weights[:, None] * outputs, axis=0) / tl.maximum(tl.sum(weights, axis=0), 1e-30)
    tl.store(out + token * out_token_stride + head * out_head_stride + dims, merged.to(out.dtype.element_ty),
             mask=dims < HEAD_DIM)
