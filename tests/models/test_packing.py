"""Fused projections assembled from their checkpoint parts."""

from __future__ import annotations

import torch

from ember.models.packing import PackedTarget, PackingPlan
from ember.quant.ggml.blocks import GGMLRowParts, GGMLTensor
from tests.quant.ggml_factory import random_blocks


def _fuse(parts: list[GGMLTensor | torch.Tensor]) -> GGMLTensor | torch.Tensor:
    names = [f"{p}.weight" for p in ("q", "k", "v")]
    plan = PackingPlan({name: PackedTarget("qkv.weight", i, 3) for i, name in enumerate(names)})
    results = [plan.add(name, part) for name, part in zip(names, parts, strict=True)]
    assert results[:2] == [None, None]
    return results[2][1]


def test_parts_mixing_q5_0_and_q8_0_fuse_as_q8_0_with_the_same_values():
    parts = [random_blocks("Q5_0", 16, 64, seed=1), random_blocks("Q4_0", 8, 64, seed=2), random_blocks("Q8_0", 8, 64, seed=3)]
    fused = _fuse(parts)
    assert isinstance(fused, GGMLTensor) and fused.format.name == "Q8_0" and fused.shape == (32, 64)
    assert torch.equal(fused.dequantize(), torch.cat([p.dequantize() for p in parts]))


def test_parts_with_a_min_among_other_formats_stay_in_their_own_blocks():
    parts = [random_blocks("Q5_1", 8, 64, seed=1), random_blocks("Q8_0", 8, 64, seed=2), random_blocks("Q8_0", 8, 64, seed=3)]
    fused = _fuse(parts)
    assert isinstance(fused, GGMLRowParts) and fused.shape == (24, 64)
    assert [p.format.name for p in fused.parts] == ["Q5_1", "Q8_0", "Q8_0"]
    assert torch.equal(fused.dequantize(), torch.cat([p.dequantize() for p in parts]))


def test_k_quant_parts_of_different_formats_stay_in_their_own_blocks():
    parts = [random_blocks("Q4_K", 16, 256, seed=1), random_blocks("Q4_K", 8, 256, seed=2), random_blocks("Q6_K", 8, 256, seed=3)]
    fused = _fuse(parts)
    assert isinstance(fused, GGMLRowParts) and fused.shape == (32, 256)
    assert torch.equal(fused.dequantize(), torch.cat([p.dequantize() for p in parts]))


def test_float_and_block_parts_fuse_as_float():
    parts = [random_blocks("Q8_0", 8, 64, seed=1), torch.randn(8, 64), random_blocks("Q8_0", 8, 64, seed=3)]
    fused = _fuse(parts)
    assert isinstance(fused, torch.Tensor) and fused.shape == (24, 64)
    assert torch.equal(fused, torch.cat([p if isinstance(p, torch.Tensor) else p.dequantize() for p in parts]))
