"""Attention over the paged KV cache for a flat batch of mixed prefill and decode requests.

The cache of one layer is a tensor `[2, num_blocks, block_size, num_kv_heads, head_dim]`
(keys, values). A token's slot is `block_id * block_size + offset`. Each step writes the new
tokens' keys and values to their slots first, then every request attends to its own blocks
only, causally: no attention crosses requests.

A layer group with a sliding window of W tokens (its metadata's `sliding_window`) lets the
query at position p see keys p - W + 1 .. p only; its block tables may start with blocks the
KV manager gave back (id -1), which lie wholly before every window of the step and are skipped.

On the CPU the fused op of ember.layers.cpu_attention does all of it in one call, reading K/V
through the block tables; on CUDA the Triton kernel of ember.layers.triton_kernels does the same
(not yet: float8 caches, trees of drafts). The torch code below is their reference and the fallback
(EMBER_PURE_TORCH=1, no compiler, no triton, other devices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

import torch
import torch.nn.functional as F

from ember.layers import cpu_attention
from ember.layers.cpu_attention import PagedBatch
from ember.layers.triton_kernels import kernels_for


@dataclass
class PrefillSegment:
    """One request with several new tokens: rows `[start, end)` of the flat batch."""

    start: int
    end: int
    seq_len: int  # context length after this step, new tokens included
    block_table: torch.Tensor  # [num_blocks] block ids covering seq_len
    span_mask: torch.Tensor | None = None  # [end - start] int64: a tree's rows, as `PagedBatch.span_masks`

    @property
    def num_cached(self) -> int:
        return self.seq_len - (self.end - self.start)


@dataclass
class DecodeBatch:
    """Requests with exactly one new token each, attended in one padded batch."""

    token_indices: torch.Tensor  # [batch] rows of the flat batch
    block_tables: torch.Tensor  # [batch, max_blocks], padded with block 0
    key_mask: torch.Tensor  # [batch, max_blocks * block_size] True where the key exists (and is in the window)


@dataclass
class DecodeRows:
    """The requests with one new token, as lists: their rows of the flat batch, block tables (from `first_blocks`, the
    first block a sliding window reaches), context lengths. Padded into a `DecodeBatch` only when a layer reads it: the
    fused op reads `AttentionMetadata.paged` instead, and the padding costs a decode step several tensor ops."""

    rows: list[int]
    tables: list[list[int]]
    lens: list[int]
    first_blocks: list[int]
    block_size: int
    window: int | None = None

    def batch(self) -> DecodeBatch:
        max_blocks = max(len(t) for t in self.tables)
        padded = torch.zeros(len(self.tables), max_blocks, dtype=torch.long)
        for i, table in enumerate(self.tables):
            padded[i, : len(table)] = torch.tensor(table)
        key_positions = torch.arange(max_blocks * self.block_size).unsqueeze(0)
        lengths = torch.tensor(self.lens).unsqueeze(1)
        if self.window is None:
            key_mask = key_positions < lengths
        else:
            key_positions = key_positions + torch.tensor(self.first_blocks).unsqueeze(1) * self.block_size
            key_mask = (key_positions < lengths) & (key_positions >= lengths - self.window)
        return DecodeBatch(token_indices=torch.tensor(self.rows), block_tables=padded, key_mask=key_mask)


@dataclass
class AttentionMetadata:
    """Per-step facts every attention layer needs; built once per step by the model runner."""

    slot_mapping: torch.Tensor  # [num_tokens] cache slot of each new token
    prefills: list[PrefillSegment]
    decode_rows: DecodeRows | None  # None: no request decodes this step
    sliding_window: int | None = None  # of this layer group; decode's key_mask already applies it
    paged: PagedBatch | None = None  # every sequence, for the fused CPU op
    other_groups: tuple[AttentionMetadata, ...] = ()  # layer groups 1.. of a model whose layers differ
    _decode: DecodeBatch | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def decode(self) -> DecodeBatch | None:
        """The decoding requests in one padded batch (built on first use, then shared by every layer of the step)."""
        if self._decode is None and self.decode_rows is not None:
            self._decode = self.decode_rows.batch()
        return self._decode

    def for_group(self, group: int) -> AttentionMetadata:
        """The metadata of layer group `group` (0 is this object itself)."""
        return self if group == 0 else self.other_groups[group - 1]


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' keys and values in their cache slots (cast to the cache's dtype: a float8
    cache rounds to nearest even and saturates, as the compiled op does)."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    # index_put, not index_copy_: torch has no CPU index_copy_ for float8 (no slot repeats within a step)
    kv_cache[0].view(-1, num_kv_heads, head_dim)[slot_mapping] = key.to(kv_cache.dtype)
    kv_cache[1].view(-1, num_kv_heads, head_dim)[slot_mapping] = value.to(kv_cache.dtype)


def paged_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    logit_softcap: float | None = None,
) -> torch.Tensor:
    """query [T, H, D], key/value [T, H_kv, D] of the new tokens -> output [T, H, D].

    `logit_softcap` (Gemma 2) squashes scores to `cap * tanh(score / cap)` before the softmax.
    """
    device_kernels = kernels_for(kv_cache)
    if device_kernels is not None and _triton_reads(kv_cache, metadata.paged):
        write_kv(kv_cache, key, value, metadata.slot_mapping)
        return _triton_attention(device_kernels, query, kv_cache, metadata.paged, scale, metadata.sliding_window,
                                 logit_softcap)
    op = cpu_attention.load_attention() if kv_cache.device.type == "cpu" else None
    if op is None or not op.write_kv(kv_cache, key, value, metadata.slot_mapping):
        write_kv(kv_cache, key, value, metadata.slot_mapping)
    if op is not None and metadata.paged is not None:
        out = op(query, kv_cache, metadata.paged, scale, metadata.sliding_window, logit_softcap)
        return out.to(query.dtype)
    output = torch.empty_like(query)
    for segment in metadata.prefills:
        output[segment.start : segment.end] = _prefill_attention(
            query, key, value, kv_cache, segment, scale, metadata.sliding_window, logit_softcap
        )
    if metadata.decode is not None:
        batch = metadata.decode
        output[batch.token_indices] = _decode_attention(query[batch.token_indices], kv_cache, batch, scale, logit_softcap)
    return output


def _triton_reads(kv_cache: torch.Tensor, batch: PagedBatch | None) -> bool:
    return batch is not None and batch.span_masks is None and kv_cache.dtype in (torch.float32, torch.bfloat16, torch.float16)


def _triton_attention(
    kernels: ModuleType, query: torch.Tensor, kv_cache: torch.Tensor, batch: PagedBatch, scale: float,
    sliding_window: int | None, logit_softcap: float | None,
) -> torch.Tensor:
    """The Triton kernel over the step's `PagedBatch`. The runner builds the batch on the cache's device once per step
    and says its largest query count (no device sync); a batch built on the CPU (a test's) moves here, per layer."""
    max_query_count = batch.max_query_count if batch.max_query_count is not None else int(batch.query_counts.max())
    on_device = (t.to(kv_cache.device, non_blocking=True)
                 for t in (batch.block_tables, batch.query_starts, batch.query_counts, batch.context_lens))
    return kernels.paged_attention(query, kv_cache, *on_device, scale, sliding_window, logit_softcap, max_query_count)


def _prefill_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    segment: PrefillSegment,
    scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
) -> torch.Tensor:
    q = query[segment.start : segment.end].transpose(0, 1)  # [H, n, D]
    plain = segment.span_mask is None and sliding_window is None and logit_softcap is None
    if segment.num_cached == 0 and plain and kv_cache.dtype == key.dtype:
        # Nothing cached before these tokens, and the cache holds them exactly: attend to them directly,
        # plain causal. (A float8 cache reads back its rounded values, as the compiled op does.)
        k = key[segment.start : segment.end].transpose(0, 1)
        v = value[segment.start : segment.end].transpose(0, 1)
        out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), is_causal=True, scale=scale, enable_gqa=True)
        return out.transpose(0, 1)
    # A window skips the blocks before the first query's window (they may be given back).
    first_block = 0 if sliding_window is None else max(0, segment.num_cached - sliding_window + 1) // kv_cache.shape[2]
    first_key = first_block * kv_cache.shape[2]
    k, v = _gather(kv_cache, segment.block_table[first_block:], segment.seq_len - first_key)
    num_new = segment.end - segment.start
    # Query i sits at absolute position num_cached + i and sees keys 0..num_cached + i.
    # The masks live on the query's device (the step's metadata is built on the CPU).
    query_positions = torch.arange(segment.num_cached, segment.seq_len, device=q.device).unsqueeze(1)
    key_positions = torch.arange(first_key, segment.seq_len, device=q.device).unsqueeze(0)
    mask = key_positions <= query_positions
    if sliding_window is not None:
        mask &= key_positions > query_positions - sliding_window
    if segment.span_mask is not None:
        mask &= _tree_visibility(segment.span_mask.to(q.device), segment.num_cached, key_positions)
    k, v = k.transpose(0, 1).to(q.dtype), v.transpose(0, 1).to(q.dtype)
    if logit_softcap is not None:
        return _softcapped_attention(q, k, v, mask, scale, logit_softcap).transpose(0, 1)[:num_new]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)[:num_new]


def _tree_visibility(span_mask: torch.Tensor, span_start: int, key_positions: torch.Tensor) -> torch.Tensor:
    """[n, L] True where query i may see the key: before the span always, inside it where bit (key - span_start) is set
    (-1, every bit: plain causal)."""
    offsets = (key_positions - span_start).clamp(min=0, max=63)
    bits = (span_mask.unsqueeze(1) >> offsets) & 1
    return (key_positions < span_start) | (bits == 1)


def _softcapped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, cap: float
) -> torch.Tensor:
    """q [H, n, D], k/v [H_kv, L, D], mask [n, L] -> [H, n, D] with scores capped at +-cap."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    scores = torch.matmul(q, k.transpose(1, 2)).float() * scale
    scores = cap * torch.tanh(scores / cap)
    scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


def _gather(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [seq_len, H_kv, D] of one request, read from its blocks."""
    blocks = kv_cache[:, block_table]  # [2, nb, bs, H_kv, D]
    flat = blocks.flatten(1, 2)[:, :seq_len]
    return flat[0], flat[1]


def _readable(cache_rows: torch.Tensor) -> torch.Tensor:
    """Cache rows in a dtype torch computes with: float8 widened to float32 (exactly), others as stored."""
    return cache_rows.float() if cache_rows.element_size() == 1 else cache_rows


def _decode_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, batch: DecodeBatch, scale: float, logit_softcap: float | None = None
) -> torch.Tensor:
    """query [B, H, D], one token per request -> [B, H, D]; grouped heads share their KV head."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    blocks = _readable(kv_cache[:, batch.block_tables])  # [2, B, nb, bs, H_kv, D]
    keys = blocks[0].flatten(1, 2).permute(0, 2, 3, 1)  # [B, H_kv, D, L]
    values = blocks[1].flatten(1, 2).transpose(1, 2)  # [B, H_kv, L, D]
    q = query.view(num_seqs, num_kv_heads, group, head_dim).to(keys.dtype)
    scores = torch.matmul(q, keys).float() * scale  # [B, H_kv, G, L]
    if logit_softcap is not None:
        scores = logit_softcap * torch.tanh(scores / logit_softcap)
    scores.masked_fill_(~batch.key_mask.to(scores.device)[:, None, None, :], float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(values.dtype)
    out = torch.matmul(weights, values)  # [B, H_kv, G, D]
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)
