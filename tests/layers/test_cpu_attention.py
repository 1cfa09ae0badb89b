"""The fused paged-attention op against plain attention over each sequence's gathered keys (the reference).

Random block tables (blocks scattered over the pool, tables padded with -1, windowed tables
starting with given-back -1 blocks), decode and prefill-over-prefix mixed in one batch, GQA,
sliding windows, soft-capping, float32, bfloat16 and float8 e4m3 caches, and MLA's latent form.
The e4m3 cache's write is checked bit for bit against torch's float8_e4m3fn cast over every
float32 range (subnormals, ties, saturation), and its read over all 256 codes.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import replace

import pytest
import torch

from ember.layers import attention, cpu_attention
from ember.layers.attention import PrefillSegment
from ember.layers.cpu_attention import PagedBatch
from ember.layers.rejection_sampler import DraftRow
from ember.native_build import build_shared_library, cpu_fingerprint, with_local_includes

BLOCK_SIZE = 4
CACHE_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.fixture(scope="module")
def op():
    attention = cpu_attention.load_attention()
    if attention is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set): the op is unavailable")
    return attention


def random_batch(generator, context_lens, query_counts, num_blocks, window):
    """Block tables over a shuffled pool; blocks wholly behind every query's window given back (-1)."""
    pool = torch.randperm(num_blocks, generator=generator).tolist()
    tables = []
    for context, count in zip(context_lens, query_counts, strict=True):
        needed = -(-context // BLOCK_SIZE)
        table = [pool.pop() for _ in range(needed)]
        if window is not None:
            first_visible = max(0, context - count - window + 1)
            table = [-1 if (b + 1) * BLOCK_SIZE <= first_visible else block for b, block in enumerate(table)]
        tables.append(table)
    width = max(len(t) for t in tables) + 1  # one spare column: padding is read as -1 and skipped
    starts = [0]
    for count in query_counts[:-1]:
        starts.append(starts[-1] + count)
    return PagedBatch(
        block_tables=torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32),
        query_starts=torch.tensor(starts, dtype=torch.int32),
        query_counts=torch.tensor(query_counts, dtype=torch.int32),
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
    )


def reference(query, keys, values, batch, scale, window, softcap, num_kv_heads):
    """Per sequence: gather its keys/values token by token, mask causally (and by window, and by the tree's
    ancestry where `batch.span_masks` has one), softmax."""
    out = torch.zeros(query.shape[0], query.shape[1], values.shape[-1])
    group = query.shape[1] // num_kv_heads
    for s in range(batch.block_tables.shape[0]):
        context, count, start = (int(batch.context_lens[s]), int(batch.query_counts[s]), int(batch.query_starts[s]))
        key_positions = torch.arange(context)
        blocks = batch.block_tables[s][key_positions // BLOCK_SIZE].long()
        query_positions = torch.arange(context - count, context).unsqueeze(1)
        visible = key_positions <= query_positions
        if window is not None:
            visible &= key_positions > query_positions - window
        if batch.span_masks is not None:
            for i, mask in enumerate(batch.span_masks[start : start + count].tolist()):
                for j in range(count):
                    visible[i, context - count + j] &= mask == -1 or bool(mask >> j & 1)
        assert (blocks >= 0)[visible.any(0)].all()  # given-back blocks are never visible
        blocks = blocks.clamp(min=0)
        k = keys[blocks, key_positions % BLOCK_SIZE].float()  # [L, H_kv, Dk]
        v = values[blocks, key_positions % BLOCK_SIZE].float()
        q = query[start : start + count].float()  # [n, H, Dk]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~visible, -math.inf)
        out[start : start + count] = torch.einsum("hnl,lhd->nhd", torch.softmax(scores, -1), v)
    return out


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (7, None), (None, 30.0), (5, 20.0)])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2)])
@pytest.mark.parametrize("head_dim", [16, 64])  # 64: the vectorized row update (multiples of 32); 16: the portable one
def test_fused_op_matches_plain_attention(op, cache_dtype, window, softcap, num_heads, num_kv_heads, head_dim):
    generator = torch.Generator().manual_seed(num_heads + (window or 0))
    num_blocks = 64
    # decode (1 query), prefill over a cached prefix (9 of 30), a fresh prompt (13 of 13), decode at a block edge
    context_lens, query_counts = [21, 30, 13, 8], [1, 9, 13, 1]
    batch = random_batch(generator, context_lens, query_counts, num_blocks, window)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).to(cache_dtype)
    query = torch.randn(sum(query_counts), num_heads, head_dim, generator=generator)
    ours = op(query, cache, batch, 0.25, window, softcap)
    expected = reference(query, cache[0], cache[1], batch, 0.25, window, softcap, num_kv_heads)
    assert torch.allclose(ours, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("build", "flags"), [("avx2", ("-O3", "-mavx2", "-mfma", "-fopenmp")), ("portable", ("-O3", "-fopenmp"))])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (300, 20.0)])
def test_builds_for_cpus_without_avx512_match_plain_attention(op, build, flags, window, softcap):
    """A CPU without AVX-512 walks the keys another way (block by block, online softmax), one without AVX2 in plain C:
    both built here and held to the reference on decode, verification and prefill rows over several spans."""
    cpu_flags = cpu_fingerprint()
    if build == "avx2" and not (" avx2" in cpu_flags and " fma" in cpu_flags):
        pytest.skip("this CPU cannot run an AVX2 + FMA build")
    path = build_shared_library(f"ember_paged_attention_{build}", with_local_includes(cpu_attention.SOURCE_PATH), flags)
    assert path is not None, f"the attention op no longer builds for {build}"
    other = cpu_attention.PagedAttention(ctypes.CDLL(str(path)))
    generator = torch.Generator().manual_seed(13)
    num_kv_heads, num_heads, head_dim, num_blocks = 2, 6, 64, 800
    context_lens, query_counts = [700, 5, 257, 390], [1, 1, 9, 40]
    batch = random_batch(generator, context_lens, query_counts, num_blocks, window)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    query = torch.randn(sum(query_counts), num_heads, head_dim, generator=generator)
    expected = reference(query, cache[0], cache[1], batch, 0.125, window, softcap, num_kv_heads)
    for attention_op in (other, op):
        assert torch.allclose(attention_op(query, cache, batch, 0.125, window, softcap), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("window", [None, 300])
def test_short_runs_over_long_contexts_read_in_spans_match_plain_attention(op, cache_dtype, window):
    """Decode and verification rows (short runs) over contexts of several spans (SPAN_TOKENS keys
    each, merged after), some spans wholly behind the window, beside a short decode and a prefill chunk."""
    generator = torch.Generator().manual_seed(11)
    num_kv_heads, num_heads, head_dim, num_blocks = 2, 6, 64, 1200
    context_lens, query_counts = [1030, 5, 700, 257, 600, 390], [1, 1, 9, 1, 5, 8]
    batch = random_batch(generator, context_lens, query_counts, num_blocks, window)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).to(cache_dtype)
    query = torch.randn(sum(query_counts), num_heads, head_dim, generator=generator)
    ours = op(query, cache, batch, 0.125, window)
    expected = reference(query, cache[0], cache[1], batch, 0.125, window, None, num_kv_heads)
    assert torch.allclose(ours, expected, rtol=1e-4, atol=1e-5)


def test_spans_give_the_same_bits_on_any_thread_count(op):
    generator = torch.Generator().manual_seed(12)
    batch = random_batch(generator, [1500, 600, 400], [1, 1, 4], 700, None)
    cache = torch.randn(2, 700, BLOCK_SIZE, 2, 64, generator=generator)
    query = torch.randn(6, 4, 64, generator=generator)
    threads = torch.get_num_threads()
    try:
        outputs = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            outputs.append(op(query, cache, batch, 0.125))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(outputs[0], other) for other in outputs[1:])


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_latent_form_reads_values_from_the_latent_rows(op, cache_dtype):
    generator = torch.Generator().manual_seed(5)
    rank, rope_dim, num_heads, num_blocks = 32, 8, 5, 200
    batch = random_batch(generator, [17, 3, 26, 600], [1, 1, 1, 1], num_blocks, None)  # 600: three spans
    cache = torch.randn(num_blocks, BLOCK_SIZE, rank + rope_dim, generator=generator).to(cache_dtype)
    query = torch.randn(4, num_heads, rank + rope_dim, generator=generator)
    ours = op.latent(query, cache, rank, batch, 0.1)
    rows = cache.unsqueeze(2)  # one kv head
    expected = reference(query, rows, rows[..., :rank], batch, 0.1, None, None, 1)
    assert torch.allclose(ours, expected, rtol=1e-4, atol=1e-5)


def test_strided_queries_read_in_place_give_the_same_output(op):
    """Queries as a view into a fused q|k|v projection (tokens strided) match their contiguous copy."""
    generator = torch.Generator().manual_seed(11)
    num_heads, num_kv_heads, head_dim, num_blocks = 6, 2, 16, 32
    batch = random_batch(generator, [9, 14], [1, 5], num_blocks, None)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    fused = torch.randn(6, num_heads + 2 * num_kv_heads, head_dim, generator=generator)
    strided = fused[:, :num_heads]
    assert not strided.is_contiguous()
    assert torch.equal(op(strided, cache, batch, 0.25), op(strided.contiguous(), cache, batch, 0.25))


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_write_kv_stores_rows_in_their_slots_as_torch_does(op, cache_dtype):
    """Strided key/value views go to their slots, rounded to the cache dtype exactly as `.to()` rounds."""
    generator = torch.Generator().manual_seed(3)
    num_kv_heads, head_dim, num_blocks = 2, 8, 6
    fused = torch.randn(5, 2 + 2 * num_kv_heads, head_dim, generator=generator) * 100
    key, value = fused[:, 2 : 2 + num_kv_heads], fused[:, 2 + num_kv_heads :]
    slots = torch.tensor([3, 17, 0, 22, 9])
    ours = torch.zeros(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, dtype=cache_dtype)
    assert op.write_kv(ours, key, value, slots)
    expected = torch.zeros_like(ours)
    expected[0].view(-1, num_kv_heads, head_dim)[slots] = key.to(cache_dtype)
    expected[1].view(-1, num_kv_heads, head_dim)[slots] = value.to(cache_dtype)
    assert torch.equal(ours, expected)


def test_write_kv_declines_layouts_it_cannot_take(op):
    cache = torch.zeros(2, 4, BLOCK_SIZE, 2, 8)
    key = torch.randn(3, 2, 8)
    assert not op.write_kv(cache, key.double(), key.double(), torch.tensor([0, 1, 2]))
    assert not op.write_kv(cache, key, key, torch.tensor([0, 1, 2], dtype=torch.int32))
    assert not cache.any()


FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]
# Each float8 format's rounding edges: its largest finite value, the tie above it, beyond, and where float32 values
# land below its subnormals. e4m3 saturates at 448; e5m2, as torch casts it, overflows to infinity from 61440 (the
# tie past 57344, rounded to even).
FP8_EDGES = {
    torch.float8_e4m3fn: [2.0**-10, 2.0**-10 * 3, 2.0**-6, 447.9, 448.0, 460.0, 464.0, 464.1, 480.0, 1e4],
    torch.float8_e5m2: [2.0**-17, 2.0**-17 * 3, 2.0**-14, 57343.0, 57344.0, 61439.9, 61440.0, 65535.0, 65536.0, 1e5],
}


def fp8_probe_values(dtype: torch.dtype) -> torch.Tensor:
    """float32 inputs covering every rounding case of a float8 format: each code's value, the ties halfway between
    neighbours and one float32 ulp either side of them, subnormals of both formats, the overflow edge (`FP8_EDGES`,
    infinity), and random magnitudes over 2^-40..2^40, both signs."""
    codes = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    exact = codes[codes.isfinite()].unique()
    ties = (exact[1:] + exact[:-1]) / 2
    near = torch.cat([ties.nextafter(torch.full_like(ties, math.inf)), ties.nextafter(torch.full_like(ties, -math.inf))])
    edges = torch.tensor([0.0, 1e-45, 1e-38, *FP8_EDGES[dtype], 3.4e38, math.inf])
    generator = torch.Generator().manual_seed(0)
    spread = torch.rand(20000, generator=generator) * torch.pow(2.0, torch.randint(-40, 40, (20000,), generator=generator).float())
    magnitudes = torch.cat([exact.abs(), ties.abs(), near.abs(), edges, spread])
    return torch.cat([magnitudes, -magnitudes])


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_write_rounds_as_torch_casts_bit_for_bit(op, dtype):
    values = fp8_probe_values(dtype)
    cache = torch.zeros(2, 1, 1, 1, values.numel(), dtype=dtype)
    rows = values.view(1, 1, -1)
    assert op.write_kv(cache, rows, -rows, torch.tensor([0]))
    expected = values.to(dtype).view(torch.uint8)
    assert torch.equal(cache[0].flatten().view(torch.uint8), expected)
    assert torch.equal(cache[1].flatten().view(torch.uint8), (-values).to(dtype).view(torch.uint8))
    if dtype == torch.float8_e4m3fn:  # saturation: everything at or beyond 448 (infinity too) is +-448, never NaN
        assert cache[0].flatten()[values.abs() >= 448].float().abs().eq(448).all()


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_write_keeps_nan_a_nan(op, dtype):
    cache = torch.zeros(2, 1, 1, 1, 2, dtype=dtype)
    rows = torch.tensor([[[math.nan, -math.nan]]])
    assert op.write_kv(cache, rows, rows, torch.tensor([0]))
    assert cache.float().isnan().all()


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_read_widens_every_code_exactly(op, dtype):
    """One visible key: the softmax weight is exactly 1, so the output is the value row as the kernel read it."""
    codes = torch.arange(256, dtype=torch.uint8).view(dtype)
    codes = codes[codes.float().isfinite()]
    cache = torch.zeros(2, 1, BLOCK_SIZE, 1, codes.numel(), dtype=dtype)
    cache[1, 0, 0, 0] = codes
    batch = PagedBatch(
        block_tables=torch.tensor([[0]], dtype=torch.int32), query_starts=torch.tensor([0], dtype=torch.int32),
        query_counts=torch.tensor([1], dtype=torch.int32), context_lens=torch.tensor([1], dtype=torch.int32),
    )
    out = op(torch.zeros(1, 1, codes.numel()), cache, batch, 1.0)
    assert torch.equal(out.flatten(), codes.float())


def random_tree(generator, num_nodes: int) -> DraftRow:
    parents = [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(num_nodes)]
    return DraftRow(list(range(num_nodes)), parents=parents)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_tree_rows_see_only_their_ancestors(op, cache_dtype, head_dim):
    """Verification of drafted trees (Medusa): a short tree (read in spans), a tree of 40 nodes (read in query
    chunks, past one 32-bit half of the masks), beside a plain decode row and a plain prefill chunk."""
    generator = torch.Generator().manual_seed(head_dim)
    num_kv_heads, num_heads, num_blocks = 2, 6, 256
    small, large = random_tree(generator, 5), random_tree(generator, 40)
    context_lens, query_counts = [300, 23, 90, 45], [6, 1, 41, 7]
    batch = random_batch(generator, context_lens, query_counts, num_blocks, None)
    batch.span_masks = torch.tensor([*small.span_masks(), -1, *large.span_masks(), *[-1] * 7], dtype=torch.long)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).to(cache_dtype)
    query = torch.randn(sum(query_counts), num_heads, head_dim, generator=generator)
    ours = op(query, cache, batch, 0.125)
    expected = reference(query, cache[0], cache[1], batch, 0.125, None, None, num_kv_heads)
    assert torch.allclose(ours, expected, rtol=1e-4, atol=1e-5)
    causal = reference(query, cache[0], cache[1], replace(batch, span_masks=None), 0.125, None, None, num_kv_heads)
    assert not torch.allclose(ours, causal, rtol=1e-4, atol=1e-5)  # the masks changed what the rows saw


def test_the_torch_path_masks_a_tree_as_the_op_does():
    """The fallback (no compiler) attends a tree's rows to their ancestors only, as `reference` does."""
    generator = torch.Generator().manual_seed(5)
    num_kv_heads, num_heads, head_dim, num_blocks = 2, 4, 16, 64
    tree = random_tree(generator, 9)
    context, count = 37, 10
    batch = random_batch(generator, [context], [count], num_blocks, None)
    batch.span_masks = torch.tensor(tree.span_masks(), dtype=torch.long)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    query = torch.randn(count, num_heads, head_dim, generator=generator)
    table = batch.block_tables[0][batch.block_tables[0] >= 0].long()
    segment = PrefillSegment(0, count, context, table, batch.span_masks)
    key = value = torch.zeros(count, num_kv_heads, head_dim)  # unused: the rows are read from the cache
    ours = attention._prefill_attention(query, key, value, cache, segment, 0.25)
    expected = reference(query, cache[0], cache[1], batch, 0.25, None, None, num_kv_heads)
    assert torch.allclose(ours, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("count", [5, 12, 40])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (37, None), (None, 20.0)])
def test_a_verification_row_gets_the_bits_of_the_decode_step_at_its_position(op, count, window, softcap):
    """Rows of a run of up to SPAN_QUERIES queries (a verification) are read in spans as a decode step is, so each
    equals, bit for bit, the one-query run at its position: speculation cannot move a greedy choice through
    attention's rounding (int8-rounded activations would magnify any last-bit difference), over several spans,
    with a window that starts each row's keys elsewhere, and with soft-capping."""
    generator = torch.Generator().manual_seed(count)
    num_kv_heads, num_heads, head_dim, num_blocks, context = 3, 9, 64, 256, 300
    batch = random_batch(generator, [context], [count], num_blocks, window)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    query = torch.randn(count, num_heads, head_dim, generator=generator)
    run = op(query, cache, batch, 0.125, window, softcap)
    assert torch.allclose(run, reference(query, cache[0], cache[1], batch, 0.125, window, softcap, num_kv_heads),
                          rtol=1e-4, atol=1e-5)
    for i in range(count):
        position = context - count + i
        one = replace(batch, query_starts=torch.zeros(1, dtype=torch.int32), query_counts=torch.ones(1, dtype=torch.int32),
                      context_lens=torch.tensor([position + 1], dtype=torch.int32))
        assert torch.equal(run[i], op(query[i : i + 1], cache, one, 0.125, window, softcap)[0])
