"""The compiled elementwise ops against their torch references (RMSNorm, rotary, SwiGLU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ember.layers.activation import silu_and_mul
from ember.layers.cpu_elementwise import load_elementwise
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding


@pytest.fixture(scope="module")
def ops():
    loaded = load_elementwise()
    if loaded is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set): the ops are unavailable")
    return loaded


def make_norm(hidden: int, weight_dtype: torch.dtype) -> RMSNorm:
    norm = RMSNorm(hidden, 1e-5)
    norm.weight.data = (torch.randn(hidden, generator=torch.Generator().manual_seed(0)) + 1).to(weight_dtype)
    return norm


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 600])  # 600 x 576 floats crosses the threading threshold
def test_rms_norm_and_fused_residual_add_match_torch(ops, weight_dtype, rows):
    norm = make_norm(576, weight_dtype)
    x, delta = torch.randn(rows, 576) * 3, torch.randn(rows, 576)
    torch.testing.assert_close(norm(x), norm.reference(x), rtol=1e-5, atol=1e-5)
    normed, total = norm.add_and_norm(x, delta)
    assert torch.equal(total, x + delta)
    torch.testing.assert_close(normed, norm.reference(x + delta), rtol=1e-5, atol=1e-5)


def test_rms_norm_declines_what_it_cannot_take(ops):
    weight = torch.ones(8)
    assert ops.rms_norm(torch.randn(2, 8).double(), weight, 1e-5) is None
    assert ops.rms_norm(torch.randn(8, 2).t(), weight, 1e-5) is None  # not contiguous
    assert ops.rms_norm(torch.randn(2, 8), torch.ones(4), 1e-5) is None  # weight of another width
    assert ops.rms_norm(torch.randn(2, 8), weight, 1e-5, delta=torch.randn(1, 8)) is None


def test_rms_norm_gives_the_same_bits_whatever_the_inputs_layout(ops):
    """One key head a token, read out of a fused projection, is a strided view (a Qwen3 tensor-parallel rank's keys):
    its norm must round as the contiguous rows do, or one process and its ranks drift apart."""
    norm = make_norm(16, torch.float32)
    fused = torch.randn(37, 4, 16)
    keys = fused[:, 2:3].reshape(-1, 16)  # a view with rows 64 floats apart
    assert not keys.is_contiguous()
    assert torch.equal(norm(keys), norm(keys.contiguous()))


@pytest.mark.parametrize("head_dim", [64, 10])
def test_rotary_in_place_on_a_strided_view_matches_rotate(ops, head_dim):
    rotary = RotaryEmbedding(head_dim, 512, 10000.0, None)
    fused = torch.randn(6, 9 + 2 * 3, head_dim)
    positions = torch.tensor([0, 1, 77, 300, 511, 5])
    expected = rotary.rotate(positions, fused[:, :12].clone())
    untouched = fused[:, 12:].clone()
    assert ops.rotary_(fused[:, :12], positions, rotary.cos, rotary.sin)
    torch.testing.assert_close(fused[:, :12], expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(fused[:, 12:], untouched)


def test_rotary_refuses_a_position_past_its_tables_and_writes_nothing(ops):
    rotary = RotaryEmbedding(16, 32, 10000.0, None)
    x = torch.randn(2, 3, 16)
    before = x.clone()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        rotary.rotate_(torch.tensor([4, 32]), x)
    assert torch.equal(x, before)


@pytest.mark.parametrize("inner", [1536, 13])  # 13: the scalar tail after the 8-wide vectors
def test_silu_and_mul_matches_torch_over_a_wide_range(ops, inner):
    gate_up = torch.randn(5, 2 * inner) * 30  # saturates e^-x at both ends
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(silu_and_mul(gate_up), F.silu(gate) * up, rtol=1e-6, atol=1e-6)
    assert ops.silu_mul(gate_up.double()) is None
