"""The layers pick their kernel by their tensors' device: CUDA tensors run the Triton kernels, CPU tensors the
compiled C / torch path as before.

The CUDA tests run a layer twice on the same inputs, on the CPU (the compiled op, the reference every CPU
test holds) and on the GPU (through the dispatch), and compare; they skip where there is no GPU.
"""

from __future__ import annotations

import pytest
import torch

from ember.layers import attention
from ember.layers.attention import AttentionMetadata, DecodeRows, PrefillSegment
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.layers.triton_kernels import kernels_for, load_triton_kernels
from tests.layers.test_cpu_attention import BLOCK_SIZE, random_batch

cuda = pytest.mark.cuda


def test_cpu_tensors_get_no_triton_kernels():
    """The CPU keeps its compiled path: the dispatch hands no Triton kernel to a CPU tensor, interpreter or not."""
    assert kernels_for(torch.zeros(1)) is None


@pytest.fixture(scope="module")
def gpu():
    if load_triton_kernels() is None:
        pytest.skip("triton is not installed (pip install -e '.[gpu]')")
    return torch.device("cuda")


@cuda
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (6, 30.0)])
def test_paged_attention_on_cuda_writes_the_new_keys_and_matches_the_cpu_path(gpu, window, softcap):
    """A decode, a chunk over a prefix and a fresh prompt: the same step's cache and output on both devices."""
    generator = torch.Generator().manual_seed(2)
    num_kv_heads, num_heads, head_dim, num_blocks = 2, 6, 64, 40
    context_lens, query_counts = [21, 30, 20], [1, 9, 20]
    batch = random_batch(generator, context_lens, query_counts, num_blocks, window)
    slots = [int(batch.block_tables[s, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE
             for s, (context, count) in enumerate(zip(context_lens, query_counts, strict=True))
             for p in range(context - count, context)]
    metadata = AttentionMetadata(slot_mapping=torch.tensor(slots), prefills=[], decode_rows=None,
                                 sliding_window=window, paged=batch)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator)
    query = torch.randn(sum(query_counts), num_heads, head_dim, generator=generator)
    key, value = (torch.randn(sum(query_counts), num_kv_heads, head_dim, generator=generator) for _ in range(2))
    gpu_cache = cache.to(gpu)
    expected = attention.paged_attention(query, key, value, cache, metadata, 0.125, softcap)
    gpu_metadata = AttentionMetadata(slot_mapping=metadata.slot_mapping.to(gpu), prefills=[], decode_rows=None,
                                     sliding_window=window, paged=batch)
    ours = attention.paged_attention(query.to(gpu), key.to(gpu), value.to(gpu), gpu_cache, gpu_metadata, 0.125, softcap)
    assert torch.equal(gpu_cache.cpu(), cache)
    assert torch.allclose(ours.cpu(), expected, rtol=1e-4, atol=1e-4)


@cuda
def test_float8_cache_on_cuda_falls_back_to_the_torch_path_and_matches_the_cpu_op(gpu):
    """The Triton kernel reads no float8 cache: on CUDA such a step runs ember's torch attention (prefill segments and
    padded decode rows, its masks built on the query's device), equal to the compiled CPU op within float32 rounding."""
    generator = torch.Generator().manual_seed(8)
    num_kv_heads, num_heads, head_dim, num_blocks = 2, 4, 32, 40
    context_lens, query_counts = [21, 30, 8], [1, 9, 1]
    batch = random_batch(generator, context_lens, query_counts, num_blocks, None)
    tables = [[b for b in row if b >= 0] for row in batch.block_tables.tolist()]
    slots = [tables[s][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
             for s, (context, count) in enumerate(zip(context_lens, query_counts, strict=True))
             for p in range(context - count, context)]
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots), paged=batch,
        prefills=[PrefillSegment(1, 10, 30, torch.tensor(tables[1]))],
        decode_rows=DecodeRows([0, 10], [tables[0], tables[2]], [21, 8], [0, 0], BLOCK_SIZE),
    )
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).to(torch.float8_e4m3fn)
    query = torch.randn(sum(query_counts), num_heads, head_dim, generator=generator)
    key, value = (torch.randn(sum(query_counts), num_kv_heads, head_dim, generator=generator) for _ in range(2))
    gpu_cache = cache.to(gpu)
    expected = attention.paged_attention(query, key, value, cache, metadata, 0.125)
    metadata.slot_mapping = metadata.slot_mapping.to(gpu)
    ours = attention.paged_attention(query.to(gpu), key.to(gpu), value.to(gpu), gpu_cache, metadata, 0.125)
    assert torch.equal(gpu_cache.cpu().view(torch.uint8), cache.view(torch.uint8))
    assert torch.allclose(ours.cpu(), expected, rtol=1e-4, atol=1e-4)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_residual_on_cuda_match_the_cpu_path(gpu, dtype):
    generator = torch.Generator().manual_seed(4)
    norm = RMSNorm(96, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=generator))
    x, delta = (torch.randn(7, 96, generator=generator).to(dtype) for _ in range(2))
    expected_normed, expected_total = norm.add_and_norm(x, delta)
    norm_on_gpu = RMSNorm(96, eps=1e-5).to(gpu)
    norm_on_gpu.load_state_dict(norm.state_dict())
    normed, total = norm_on_gpu.add_and_norm(x.to(gpu), delta.to(gpu))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.equal(total.cpu(), expected_total)
    assert torch.allclose(normed.cpu().float(), expected_normed.float(), rtol=tolerance, atol=tolerance)
    assert torch.allclose(norm_on_gpu(x.to(gpu)).cpu().float(), norm(x).float(), rtol=tolerance, atol=tolerance)


@cuda
def test_rotary_in_place_on_cuda_matches_the_cpu_path(gpu):
    generator = torch.Generator().manual_seed(6)
    on_cpu = RotaryEmbedding(64, 128, 10000.0, None)
    on_gpu = RotaryEmbedding(64, 128, 10000.0, None, device="cuda")
    heads = torch.randn(5, 4, 64, generator=generator)
    positions = torch.tensor([0, 9, 127, 3, 3])
    expected = on_cpu.rotate_(positions, heads.clone())
    ours = on_gpu.rotate_(positions.to(gpu), heads.to(gpu))
    assert torch.allclose(ours.cpu(), expected, rtol=1e-5, atol=1e-5)
