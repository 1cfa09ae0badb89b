"""The fused paged-attention CPU op (ember/layers/csrc/paged_attention.c) and its Python face.

It reads K/V through the block tables (no padded copy), shares each K/V row between the query
heads of a group, and runs an online softmax; decode, prefill over a cached prefix, sliding
windows (given-back blocks, id -1, are skipped), soft-capping and MLA's absorbed decode are one
loop. Built on first use like the GEMM; None from `load_attention()` (no compiler, or
EMBER_PURE_TORCH=1) means the torch path in ember.layers.attention runs instead.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from ember.native_build import load_cpu_kernels

SOURCE_PATH = Path(__file__).parent / "csrc" / "paged_attention.c"
# The cache dtypes the kernels read and write, and their `cache_format` codes (CACHE_* in paged_attention.c).
CACHE_FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}
CACHE_DTYPES = tuple(CACHE_FORMATS)


class AttentionArgs(ctypes.Structure):
    """The kernel's argument block (`attention_args` in paged_attention.c; the same layout)."""

    _fields_ = [
        ("query", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("keys", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
        ("token_stride", ctypes.c_int64),
        ("head_stride", ctypes.c_int64),
        ("num_heads", ctypes.c_int64),
        ("num_kv_heads", ctypes.c_int64),
        ("dim_k", ctypes.c_int64),
        ("dim_v", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("cache_format", ctypes.c_int),
        ("block_tables", ctypes.c_void_p),
        ("query_starts", ctypes.c_void_p),
        ("query_counts", ctypes.c_void_p),
        ("context_lens", ctypes.c_void_p),
        ("num_seqs", ctypes.c_int64),
        ("max_blocks", ctypes.c_int64),
        ("scale", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("window", ctypes.c_int64),
        ("query_stride", ctypes.c_int64),
        ("span_masks", ctypes.c_void_p),
    ]


@dataclass
class PagedBatch:
    """Every sequence of a step as the fused op reads it (int32, built once per step and layer group).

    Sequence s has query rows `[query_starts[s], query_starts[s] + query_counts[s])` of the flat
    batch, `context_lens[s]` tokens in the cache once this step's are written, and its block
    table in row s of `block_tables` (padded with -1; -1 also marks blocks given back behind a window).
    `span_masks` (a step that verifies a tree of drafts): per query row, -1 for plain causal, else
    the bits of the step's own tokens of its sequence the row sees (its ancestors in the tree).
    """

    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    query_starts: torch.Tensor  # [num_seqs] int32
    query_counts: torch.Tensor  # [num_seqs] int32
    context_lens: torch.Tensor  # [num_seqs] int32
    span_masks: torch.Tensor | None = None  # [num_tokens] int64
    max_query_count: int | None = None  # the largest query_counts, known on the host (None: read from the tensor)

    def decode_only(self) -> PagedBatch:
        """The sequences with one query each, their queries renumbered 0..B-1 in batch order."""
        is_decode = self.query_counts == 1
        num_decode = int(is_decode.sum())
        return PagedBatch(
            block_tables=self.block_tables[is_decode],
            query_starts=torch.arange(num_decode, dtype=torch.int32),
            query_counts=self.query_counts[is_decode],
            context_lens=self.context_lens[is_decode],
        )


class PagedAttention:
    """The compiled op; `__call__` for a standard cache, `latent` for MLA's absorbed decode."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library  # the compiled decoder layer calls its functions too
        self._function = library.ember_paged_attention
        self._function.argtypes = [ctypes.POINTER(AttentionArgs)]
        self._function.restype = ctypes.c_int
        self._write_kv = library.ember_write_kv
        self._write_kv.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] + [ctypes.c_void_p] * 2 + [
            ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self._write_kv.restype = None

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
        """Store float32 key/value rows [T, H_kv, D] in their slots; False (nothing written) for layouts it cannot take.

        The rows may be strided views of a fused projection's output (heads contiguous, both with
        the same token stride), as Llama's q/k/v are.
        """
        if not _writable_rows(key, value, kv_cache, slot_mapping):
            return False
        self._write_kv(
            key.data_ptr(), value.data_ptr(), key.stride(0), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(),
            CACHE_FORMATS[kv_cache.dtype], slot_mapping.data_ptr(), key.shape[0], key.shape[1] * key.shape[2],
        )
        return True

    def __call__(
        self,
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        batch: PagedBatch,
        scale: float,
        sliding_window: int | None = None,
        logit_softcap: float | None = None,
    ) -> torch.Tensor:
        """query [T, H, D] over kv_cache [2, blocks, block_size, H_kv, D] -> [T, H, D] in float32."""
        _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
        keys, values = kv_cache[0], kv_cache[1]
        return self._run(query, keys, values, head_dim, batch, scale, sliding_window, logit_softcap,
                         block_size=block_size, num_kv_heads=num_kv_heads, token_stride=num_kv_heads * head_dim,
                         head_stride=head_dim)

    def latent(self, query: torch.Tensor, cache: torch.Tensor, value_dim: int, batch: PagedBatch, scale: float) -> torch.Tensor:
        """MLA: query [T, H, r + d_rope] over latent cache [blocks, block_size, r + d_rope] -> [T, H, r]."""
        _, block_size, width = cache.shape
        return self._run(query, cache, cache, value_dim, batch, scale, None, None,
                         block_size=block_size, num_kv_heads=1, token_stride=width, head_stride=0)

    def _run(self, query, keys, values, value_dim, batch, scale, window, softcap, **layout) -> torch.Tensor:
        if not (keys.is_contiguous() and values.is_contiguous()) or keys.dtype not in CACHE_DTYPES:
            raise ValueError("the fused attention op needs a contiguous float32, bfloat16, float8_e4m3fn or float8_e5m2 cache")
        query32 = query if _rows_of_contiguous_heads(query) else query.float().contiguous()
        num_tokens, num_heads, key_dim = query32.shape
        out = torch.empty(num_tokens, num_heads, value_dim, dtype=torch.float32)
        args = AttentionArgs(
            query=query32.data_ptr(), out=out.data_ptr(), keys=keys.data_ptr(), values=values.data_ptr(),
            num_heads=num_heads, dim_k=key_dim, dim_v=value_dim, cache_format=CACHE_FORMATS[keys.dtype],
            block_tables=batch.block_tables.data_ptr(), query_starts=batch.query_starts.data_ptr(),
            query_counts=batch.query_counts.data_ptr(), context_lens=batch.context_lens.data_ptr(),
            num_seqs=batch.block_tables.shape[0], max_blocks=batch.block_tables.shape[1], scale=scale,
            softcap=logit_softcap_or_zero(softcap), window=window or 0, query_stride=query32.stride(0),
            span_masks=span_masks_pointer(batch), **layout,
        )
        status = self._function(ctypes.byref(args))
        if status != 0:
            raise RuntimeError(f"fused paged attention failed (status {status}): over 1024 query rows in a work item, or no memory")
        return out


def _rows_of_contiguous_heads(x: torch.Tensor) -> bool:
    """x [T, H, D] float32 on the CPU, each token's heads one contiguous run (tokens may be strided)."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def _writable_rows(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
    return (
        _rows_of_contiguous_heads(key)
        and _rows_of_contiguous_heads(value)
        and key.stride(0) == value.stride(0)
        and kv_cache.is_contiguous()
        and kv_cache.dtype in CACHE_DTYPES
        and slot_mapping.dtype == torch.int64
        and slot_mapping.is_contiguous()
    )


def span_masks_pointer(batch: PagedBatch) -> int | None:
    """The address of the batch's tree masks for the kernel; None (NULL, all causal) when it has none."""
    masks = batch.span_masks
    if masks is None:
        return None
    if masks.dtype != torch.int64 or not masks.is_contiguous():
        raise ValueError("span_masks must be a contiguous int64 tensor, one entry per query row")
    return masks.data_ptr()


def logit_softcap_or_zero(softcap: float | None) -> float:
    return 0.0 if softcap is None else float(softcap)


@functools.cache
def load_attention() -> PagedAttention | None:
    """The op, built and loaded once per process; None when unavailable."""
    library = load_cpu_kernels("ember_paged_attention", SOURCE_PATH)
    return None if library is None else PagedAttention(library)
