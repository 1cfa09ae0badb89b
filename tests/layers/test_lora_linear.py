"""LoRALinear against the per-row definition: out[row] = base(x[row]) + B_s (A_s x[row]) for the slot s its row holds,
rows of no slot left as the base layer gives them, whatever order the step's rows come in."""

from __future__ import annotations

import ctypes

import pytest
import torch

from ember.layers.linear import Linear
from ember.layers.lora import LoRALinear, LoRAProduct, LoRARows


def random_product(generator: torch.Generator, segments: list[tuple[int, int, int]], rank: int, inputs: int = 8) -> LoRAProduct:
    """A product over `inputs` inputs whose segments (first row, end row, first column) each read `rank` columns."""
    b_parts = [torch.randn(end - start, rank, generator=generator) for start, end, _ in segments]
    return LoRAProduct.of_parts(torch.randn(rank * len(segments), inputs, generator=generator), b_parts, segments)


def test_each_row_gets_its_own_slots_product_and_rows_without_one_stay_the_base_layers() -> None:
    generator = torch.Generator().manual_seed(0)
    base = Linear(8, 12)
    rows = LoRARows()
    layer = LoRALinear(base, rows, num_slots=3)
    fused = random_product(generator, [(0, 4, 0), (8, 12, 2)], rank=2)  # parts 0 and 2 of a three-part layer
    plain = random_product(generator, [(0, 12, 0)], rank=3)
    layer.set_slot(0, fused)
    layer.set_slot(2, plain)
    row_slots = [2, -1, 0, 2, 0, 1]  # slot 1 holds an adapter that skips this layer
    x = torch.randn(len(row_slots), 8, generator=generator)
    rows.set_rows(row_slots)
    with torch.inference_mode():
        out = layer(x)
        base_out = base(x)
    expected = base_out.clone()  # a normal tensor, updated below
    for row, slot in enumerate(row_slots):
        if slot == 0:
            shrunk = fused.a @ x[row]
            expected[row, 0:4] += fused.b_t[0:8].view(2, 4).T @ shrunk[0:2]
            expected[row, 8:12] += fused.b_t[8:16].view(2, 4).T @ shrunk[2:4]
        elif slot == 2:
            expected[row] += plain.b_t.view(3, 12).T @ (plain.a @ x[row])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[[1, 5]], base_out[[1, 5]])  # untouched: the base layer's bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_compiled_paths_give_each_row_its_slots_product_as_torch_computes_it(dtype: torch.dtype) -> None:
    """lora.c (BGMV) as the compiled decoder layer calls it (base + adapters) and as the Python forward does (adapters
    onto the base's output), against each row's product in torch (`LoRAProduct.delta`), for float32 products and
    bfloat16 ones (widened as they are read; sums stay float32, added in another order: 1e-5)."""
    generator = torch.Generator().manual_seed(1)
    base = Linear(40, 36)
    base.pack_weights()
    rows = LoRARows()
    layer = LoRALinear(base, rows, num_slots=3, dtype=dtype)
    products = [random_product(generator, [(0, 12, 0), (24, 36, 4)], rank=4, inputs=40), None,
                random_product(generator, [(0, 36, 0)], rank=8, inputs=40)]  # slot 1: an adapter skipping this layer
    products = [None if p is None else LoRAProduct(p.a.to(dtype), p.b_t.to(dtype), p.segments) for p in products]
    for slot, product in enumerate(products):
        layer.set_slot(slot, product)
    row_slots = [2, -1, 0, 0, 1, 2, 2, -1]  # more than 4 rows: the kernel's parallel loop
    x = torch.randn(len(row_slots), 40, generator=generator)
    rows.set_rows(row_slots)
    compiled = layer.compiled_product()
    assert compiled is not None
    gemm = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 3)(compiled.gemm)
    out = torch.empty(len(row_slots), 36)
    gemm(x.data_ptr(), compiled.weight, None, out.data_ptr(), len(row_slots), 36, 40)
    with torch.inference_mode():
        forward = layer(x)
        base_out = base(x)
        expected = base_out.clone()
        for row, slot in enumerate(row_slots):
            if slot >= 0 and products[slot] is not None:
                expected[row] += products[slot].delta(x[row : row + 1], 36)[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(forward, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[[1, 4, 7]], base_out[[1, 4, 7]])  # no slot, or a slot skipping the layer: the base's bits
    assert (out - base_out).abs()[[0, 2, 3, 5, 6]].amax(dim=1).gt(0.1).all()  # every adapted row changed


def test_bfloat16_activations_take_the_torch_path_per_adapter_group() -> None:
    """A bfloat16 model's rows (not lora.c's float32): each slot's rows gathered, multiplied in bfloat16, added back."""
    generator = torch.Generator().manual_seed(2)
    base = Linear(8, 12).to(torch.bfloat16)
    rows = LoRARows()
    layer = LoRALinear(base, rows, num_slots=2, dtype=torch.bfloat16)
    product = random_product(generator, [(0, 12, 0)], rank=2)
    product = LoRAProduct(product.a.bfloat16(), product.b_t.bfloat16(), product.segments)
    layer.set_slot(1, product)
    row_slots = [1, -1, 1]  # not contiguous: an index gather
    x = torch.randn(3, 8, generator=generator).bfloat16()
    rows.set_rows(row_slots)
    with torch.inference_mode():
        out = layer(x)
        base_out = base(x)
    expected = base_out.float()
    for row in (0, 2):
        expected[row] += (product.b_t.float().view(2, 12).T @ (product.a.float() @ x[row].float()))
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)  # bfloat16 throughout
    assert torch.equal(out[1], base_out[1])
