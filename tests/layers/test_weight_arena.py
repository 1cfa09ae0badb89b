"""The weight arena: page-aligned, non-overlapping tensors from one buffer advised for huge pages, and the
packed model's panels all placed in it with the same products as panels packed on their own."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from torch import nn

from ember.layers import cpu_gemm
from ember.layers.linear import Linear, pack_linear_weights
from ember.layers.weight_arena import ALIGNMENT, HUGE_PAGE_BYTES, WeightArena

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_tensors_from_the_arena_are_page_aligned_disjoint_and_keep_their_values():
    shapes = [((3, 5), torch.float32), ((1000,), torch.bfloat16), ((7, 9, 16), torch.float32)]
    arena = WeightArena(WeightArena.bytes_for(shapes))
    taken = [arena.take(shape, dtype) for shape, dtype in shapes]
    for tensor, (shape, dtype) in zip(taken, shapes, strict=True):
        assert tensor.shape == shape and tensor.dtype == dtype and tensor.data_ptr() % ALIGNMENT == 0
        tensor.copy_(torch.arange(tensor.numel()).reshape(shape).to(dtype))
    ends = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in taken)
    assert all(end <= next_start for (_, end), (next_start, _) in pairwise(ends))
    for tensor in taken:  # nothing written later overwrote an earlier tensor
        assert torch.equal(tensor.flatten().float(), torch.arange(tensor.numel()).float().to(tensor.dtype).float())
    assert taken[0].data_ptr() % HUGE_PAGE_BYTES == 0  # the first tensor starts on a huge page boundary


def test_taking_more_than_the_capacity_is_refused():
    arena = WeightArena(WeightArena.bytes_for([((16,), torch.float32)]))
    arena.take((16,), torch.float32)
    with pytest.raises(ValueError, match="arena holds"):
        arena.take((1,), torch.float32)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not THP_SETTING.exists() or "[never]" in THP_SETTING.read_text(),
                    reason="transparent huge pages are Linux's, and off here")
def test_linux_accepts_the_huge_page_advice():
    assert WeightArena(4 * HUGE_PAGE_BYTES).huge_pages


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_packed_panel_of_a_model_lies_in_one_arena_with_unchanged_products(dtype):
    if cpu_gemm.load_gemm() is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set): nothing is packed")
    torch.manual_seed(0)
    model = nn.Sequential(Linear(64, 96, bias=True), Linear(96, 33), Linear(33, 48, bias=True)).to(dtype)
    alone = [cpu_gemm.PackedWeight.from_dense(layer.weight.detach(), None if layer.bias is None else layer.bias.detach()) for layer in model]
    assert pack_linear_weights(model) == 3
    storages = {layer.packed.panels.untyped_storage().data_ptr() for layer in model}
    assert len(storages) == 1  # one buffer
    x = torch.randn(5, 64)
    with torch.inference_mode():
        for layer, reference in zip(model, alone, strict=True):
            assert torch.equal(layer.packed.panels, reference.panels)
            ours = cpu_gemm.load_gemm()(x, layer.packed)
            assert torch.equal(ours, cpu_gemm.load_gemm()(x, reference))
            x = ours.to(dtype).float()


def test_packing_into_a_tensor_of_another_shape_is_refused():
    if cpu_gemm.load_gemm() is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set): nothing is packed")
    weight = torch.randn(40, 24)
    wrong = torch.empty(cpu_gemm.PackedWeight.panel_shape(40, 32, torch.float32))
    with pytest.raises(ValueError, match="panel_shape"):
        cpu_gemm.PackedWeight.from_dense(weight, out=wrong)
