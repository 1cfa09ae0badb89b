"""The Triton kernels against their torch references (interpreter mode on a CPU, compiled on a GPU).

Paged attention is held to the same per-sequence reference as the compiled CPU op (gather each
sequence's keys through its block table, mask causally and by window, softmax): decode with GQA, a
sliding window, soft-capping and a partially filled last block, and prefill over a cached prefix beside
a fresh prompt of more rows than one program's tile. RMSNorm (+ residual) is held to
`RMSNorm.reference`, rotary to `RotaryEmbedding.rotate` on a strided view of a fused projection.
"""

from __future__ import annotations

import pytest
import torch

from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.layers.triton_kernels import load_triton_kernels
from tests.layers.test_cpu_attention import BLOCK_SIZE, random_batch, reference


@pytest.fixture(scope="module")
def kernels():
    module = load_triton_kernels()
    if module is None:
        pytest.skip("triton is not installed (pip install -e '.[gpu]')")
    return module


def run_attention(kernels, device, query, cache, batch, window, softcap, num_splits=None):
    on_device = [t.to(device) for t in (batch.block_tables, batch.query_starts, batch.query_counts, batch.context_lens)]
    out = kernels.paged_attention(query.to(device), cache.to(device), *on_device, 0.25, window, softcap,
                                  num_splits=num_splits)
    return out.cpu()


@pytest.mark.parametrize(("cache_dtype", "query_dtype", "tolerance"), [
    (torch.float32, torch.float32, 1e-4),
    (torch.bfloat16, torch.float32, 1e-4),  # bfloat16 keys widen exactly: the products are float32's
    (torch.bfloat16, torch.bfloat16, 2e-2),
])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (7, None), (None, 30.0), (5, 20.0)])
def test_decode_with_gqa_window_and_softcap_matches_gathered_attention(
    kernels, kernel_device, cache_dtype, query_dtype, tolerance, window, softcap
):
    """Four decoding sequences (one query each, 6 heads over 2 KV heads): contexts 21 and 13 end in a block holding
    one and one token of four, 8 ends on a block edge, 30 reaches back past a window whose first blocks are -1."""
    generator = torch.Generator().manual_seed(7 + (window or 0))
    num_kv_heads, num_heads, head_dim, num_blocks = 2, 6, 16, 40
    context_lens, query_counts = [21, 13, 8, 30], [1, 1, 1, 1]
    batch = random_batch(generator, context_lens, query_counts, num_blocks, window)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).to(cache_dtype)
    query = torch.randn(len(context_lens), num_heads, head_dim, generator=generator).to(query_dtype)
    ours = run_attention(kernels, kernel_device, query, cache, batch, window, softcap)
    expected = reference(query.float(), cache[0], cache[1], batch, 0.25, window, softcap, num_kv_heads)
    assert ours.dtype == query_dtype
    assert torch.allclose(ours.float(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("num_splits", [2, 4])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (7, None), (5, 20.0)])
def test_decode_split_between_programs_matches_gathered_attention(kernels, kernel_device, num_splits, window, softcap):
    """Keys split between 2 or 4 programs (flash-decoding), then merged: contexts of 70 and 45 over 32-key splits, 3
    (block 4, one token in its last block) in one split and none in the others, windows that leave whole splits
    empty."""
    generator = torch.Generator().manual_seed(num_splits + (window or 0))
    num_kv_heads, num_heads, head_dim, num_blocks = 2, 6, 16, 60
    context_lens, query_counts = [70, 3, 45], [1, 1, 1]
    batch = random_batch(generator, context_lens, query_counts, num_blocks, window)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    query = torch.randn(len(context_lens), num_heads, head_dim, generator=generator)
    ours = run_attention(kernels, kernel_device, query, cache, batch, window, softcap, num_splits)
    expected = reference(query, cache[0], cache[1], batch, 0.25, window, softcap, num_kv_heads)
    assert torch.allclose(ours, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("window", "softcap"), [(None, None), (6, 25.0)])
@pytest.mark.parametrize("head_dim", [16, 24])  # 24: padded to 32 inside the kernel
def test_prefill_over_a_cached_prefix_beside_decode_matches_gathered_attention(
    kernels, kernel_device, window, softcap, head_dim
):
    """A decode, a chunk of 9 over a prefix of 21, a fresh prompt of 20 rows (two query tiles of 16) and a decode at
    a block edge in one flat batch."""
    generator = torch.Generator().manual_seed(3 + head_dim)
    num_kv_heads, num_heads, num_blocks = 1, 2, 40
    context_lens, query_counts = [21, 30, 20, 8], [1, 9, 20, 1]
    batch = random_batch(generator, context_lens, query_counts, num_blocks, window)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    query = torch.randn(sum(query_counts), num_heads, head_dim, generator=generator)
    ours = run_attention(kernels, kernel_device, query, cache, batch, window, softcap)
    expected = reference(query, cache[0], cache[1], batch, 0.25, window, softcap, num_kv_heads)
    assert torch.allclose(ours, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("has_residual", [False, True])
def test_rms_norm_with_and_without_the_residual_add_matches_the_torch_reference(
    kernels, kernel_device, dtype, tolerance, has_residual
):
    generator = torch.Generator().manual_seed(5)
    hidden = 48  # not a power of two: the kernel masks the tail of its 64-wide row
    norm = RMSNorm(hidden, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=generator))
    x = torch.randn(5, hidden, generator=generator).to(dtype)
    delta = torch.randn(5, hidden, generator=generator).to(dtype) if has_residual else None
    out, total = kernels.rms_norm(x.to(kernel_device), norm.weight.detach().to(kernel_device), norm.eps,
                                  None if delta is None else delta.to(kernel_device))
    expected_total = x if delta is None else x + delta
    # Bit-equal in float32; within one bfloat16 step otherwise (the interpreter casts float32 to bfloat16 by
    # truncation, a GPU rounds to nearest even as torch does).
    assert torch.allclose(total.cpu(), expected_total, rtol=0 if dtype == torch.float32 else 2**-7, atol=0)
    assert out.dtype == dtype
    assert torch.allclose(out.cpu().float(), norm.reference(expected_total).detach().float(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(16, None), (16, 8)])
def test_rotary_in_place_on_a_fused_projection_view_matches_rotate(kernels, kernel_device, head_dim, rotary_dim):
    """q of a fused [tokens, q | k | v] output (a strided view), positions out of order; with rotary_dim the trailing
    dims pass unchanged, and the k and v columns beside q are left alone."""
    generator = torch.Generator().manual_seed(11)
    rotary = RotaryEmbedding(head_dim, 64, 10000.0, None, rotary_dim=rotary_dim)
    num_heads, num_kv_heads, num_tokens = 3, 1, 6
    fused = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=generator)
    positions = torch.tensor([5, 0, 63, 17, 2, 2])
    expected = rotary.rotate(positions, fused[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim))
    on_device = fused.to(kernel_device)
    query = on_device[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    kernels.rotary_(query, positions.to(kernel_device), rotary.cos.to(kernel_device), rotary.sin.to(kernel_device),
                    rotary.rotary_dim)
    assert torch.allclose(query.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(on_device[:, num_heads * head_dim :].cpu(), fused[:, num_heads * head_dim :])


def test_decode_over_a_graphs_wide_stale_block_tables_and_padding_rows_matches_gathered_attention(kernels, kernel_device):
    """A decode graph's batch (ember.engine.cuda_graphs): tables as wide as the longest context the engine serves, their
    columns past each sequence's context holding stale block ids from earlier steps, and two padding rows of one token
    on a scratch block; the default key splits (8 here, most of them past every context) leave the real rows' output
    the reference's."""
    generator = torch.Generator().manual_seed(11)
    num_kv_heads, num_heads, head_dim, num_blocks, width = 2, 6, 16, 40, 256
    context_lens = [21, 13, 8]
    batch = random_batch(generator, context_lens, [1, 1, 1], num_blocks, None)
    scratch = num_blocks - 1
    tables = torch.randint(0, num_blocks - 1, (len(context_lens) + 2, width), generator=generator, dtype=torch.int32)
    tables[: len(context_lens), : batch.block_tables.shape[1]] = batch.block_tables
    tables[len(context_lens):, 0] = scratch
    tables[0, -(-context_lens[0] // BLOCK_SIZE)] = 5  # the longest row: a stale id right after its table
    wide = type(batch)(tables, torch.arange(5, dtype=torch.int32), torch.ones(5, dtype=torch.int32),
                       torch.tensor([*context_lens, 1, 1], dtype=torch.int32))
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    query = torch.randn(5, num_heads, head_dim, generator=generator)
    ours = run_attention(kernels, kernel_device, query, cache, wide, None, None)
    expected = reference(query[:3], cache[0], cache[1], batch, 0.25, None, None, num_kv_heads)
    assert kernels._decode_splits(5 * num_kv_heads, width * BLOCK_SIZE) == 8
    assert torch.allclose(ours[:3], expected, rtol=1e-4, atol=1e-5)
