"""GGML products against the dequantized float product (the reference), on every path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ember.quant.ggml.blocks import FORMATS, GGMLRowParts
from ember.quant.ggml.kernels import (
    INT8_PASSES_AT_ANY_ROWS,
    MAX_GEMV_ROWS,
    MAX_PASS_ROWS,
    load_kernels,
)
from ember.quant.ggml.layers import (
    GGMLEmbedding,
    GGMLLinear,
    GGMLRowPartsLinear,
    ggml_linear,
    set_activations,
)
from tests.quant.ggml_factory import random_blocks

# float32 sums of 512-768 products in another order: relative error well under 1e-5 of the row norm.
RTOL, ATOL = 1e-4, 1e-4


@pytest.fixture(scope="module")
def kernels():
    loaded = load_kernels()
    if loaded is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set)")
    return loaded


def int8_rounded(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference of the kernel's activation rounding: per 32 values d = max|x| / 127,
    q = round-half-even(x / d); returns (d * q, d) with d repeated over each block's values."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(blocks * inverse) * d).reshape(x.shape), d.expand_as(blocks).reshape(x.shape)


def _case(name: str, m: int, rows: int = 67, cols: int = 768):  # 768: whole blocks of every format
    weight = random_blocks(name, rows=rows, cols=cols, seed=m)
    generator = torch.Generator().manual_seed(m)
    return weight, torch.randn(m, cols, generator=generator) * 3, torch.randn(rows, generator=generator)


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("m", [1, 3, MAX_GEMV_ROWS])
@pytest.mark.parametrize("path", ["float32", "portable"])
def test_float_gemv_matches_the_dequantized_product(kernels, name, m, path):
    weight, x, bias = _case(name, m)
    expected = F.linear(x, weight.dequantize(), bias)
    ours = kernels.gemv(x, weight, bias, path)
    torch.testing.assert_close(ours, expected, rtol=RTOL, atol=RTOL * expected.abs().max().item())


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_float_gemv_row_has_the_same_bits_in_a_pass_of_any_size(kernels, name):
    # each pass size runs its own compiled copy of the row walk: a row's arithmetic must not depend on it
    weight, x, bias = _case(name, MAX_GEMV_ROWS)
    alone = torch.cat([kernels.gemv(x[i : i + 1], weight, bias, "float32") for i in range(MAX_GEMV_ROWS)])
    for m in range(2, MAX_GEMV_ROWS + 1):
        assert torch.equal(kernels.gemv(x[:m], weight, bias, "float32"), alone[:m]), m


@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f.has_int8_kernel))
@pytest.mark.parametrize("m", [1, 2, 3, 5, MAX_GEMV_ROWS, 2 * MAX_GEMV_ROWS + 3])
def test_int8_gemv_is_the_product_with_int8_rounded_activations(kernels, name, m):
    if "int8" not in kernels.paths:
        pytest.skip("this build has no int8 path (no AVX2)")
    weight, x, bias = _case(name, m)
    dense = weight.dequantize()
    rounded, d = int8_rounded(x)
    ours = kernels.gemv(x, weight, bias, "int8")
    # The kernel's exact arithmetic is the float product with the rounded activations...
    expected = F.linear(rounded, dense, bias)
    torch.testing.assert_close(ours, expected, rtol=RTOL, atol=RTOL * expected.abs().max().item())
    # ...so against float x it errs by at most sum_j |w_j| * d_j / 2 (each x_j moved by <= d_j / 2).
    exact = F.linear(x, dense, bias)
    bound = dense.abs() @ (d / 2).t() + RTOL * exact.abs().max().item()
    assert ((ours - exact).abs() <= bound.t()).all()
    assert (ours - exact).abs().max() > 0  # the activations really were rounded


@pytest.mark.parametrize("name", ["Q4_1", "Q6_K"])
@pytest.mark.parametrize("activations", ["int8", "float32"])
def test_many_rows_use_dequantized_tiles_and_agree_with_the_few_row_kernel(kernels, name, activations):
    weight = random_blocks(name, rows=300, cols=512, seed=5)
    x = torch.randn(MAX_PASS_ROWS + 5, 512, generator=torch.Generator().manual_seed(5))
    rounded = int8_rounded(x)[0] if activations == "int8" and "int8" in kernels.paths else x
    expected = F.linear(rounded, weight.dequantize())
    ours = ggml_linear(x, weight, None, tile_values=512 * 64, activations=activations, tiles=True)  # 5 tiles of 64 rows
    atol = RTOL * expected.abs().max().item()
    torch.testing.assert_close(ours, expected, rtol=RTOL, atol=atol)
    # A row's result does not depend on how many rows share the call (the kernel's path or the tiles').
    one_by_one = torch.cat([ggml_linear(row[None], weight, None, activations=activations) for row in x])
    torch.testing.assert_close(ours, one_by_one, rtol=RTOL, atol=atol)


def test_products_run_as_passes_up_to_max_pass_rows_and_int8_ones_beyond_where_the_cpu_has_vnni(kernels):
    int8, float32 = kernels.path_for("int8"), kernels.path_for("float32")
    assert kernels.runs_in_passes(float32, MAX_PASS_ROWS) and not kernels.runs_in_passes(float32, MAX_PASS_ROWS + 1)
    assert kernels.runs_in_passes(int8, 4096) == (kernels.int8_dot_kind in INT8_PASSES_AT_ANY_ROWS)


def test_a_prefill_through_int8_passes_gives_every_row_its_one_row_bits(kernels):
    if kernels.int8_dot_kind not in INT8_PASSES_AT_ANY_ROWS:
        pytest.skip("without VNNI many int8 rows take the dequantized tiles (test_many_rows_use_dequantized_tiles...)")
    layer = GGMLLinear(random_blocks("Q4_K", rows=64, cols=256, seed=12))
    rows = 3 * MAX_PASS_ROWS + 5 if kernels.tile_rows is None else kernels.tile_rows - 1  # below AMX tiles where they run
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(12))
    with torch.inference_mode():
        assert torch.equal(layer(x), torch.cat([layer(row[None]) for row in x]))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K"])
def test_many_rows_on_amx_tiles_give_the_bfloat16_product(kernels, name):
    """Where AMX runs the int8 path's many-row products on tiles, the result is the product of x and the exact
    weights both rounded to bfloat16 (float32 sums), for every format, a partial 32-row weight block and rows past
    a 32-row activation block; a row's bits do not depend on the other rows on the tiles."""
    if kernels.tile_rows is None:
        pytest.skip("this CPU (or its kernel build) has no AMX tiles")
    layer = GGMLLinear(random_blocks(name, rows=72, cols=512, seed=13))
    generator = torch.Generator().manual_seed(13)
    x, bias = torch.randn(kernels.tile_rows + 37, 512, generator=generator), torch.randn(72, generator=generator)
    layer.bias = torch.nn.Parameter(bias, requires_grad=False)
    with torch.inference_mode():
        ours = layer(x)
        shifted = layer(x[5 : 5 + kernels.tile_rows])
    exact = layer.weight_blocks.dequantize()
    reference = F.linear(x.bfloat16().double(), exact.bfloat16().double(), bias.double()).float()
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5 * reference.abs().max().item())
    assert not torch.allclose(ours, F.linear(x, exact, bias), rtol=1e-5, atol=1e-5 * reference.abs().max().item())
    assert torch.equal(shifted, ours[5 : 5 + kernels.tile_rows])


def test_linear_layer_keeps_the_blocks_and_maps_leading_dimensions():
    weight = random_blocks("Q8_0", rows=40, cols=64, seed=6)
    layer = GGMLLinear(weight, activations="float32")
    assert layer.qweight.dtype == torch.uint8 and dict(layer.state_dict()) == {}
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == (2, 3, 40)
    torch.testing.assert_close(out, F.linear(x, weight.dequantize()), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["NF4", "FP8"])
def test_float_code_formats_run_float32_activations_on_every_row_count(kernels, name):
    weight = random_blocks(name, rows=40, cols=128, seed=9)
    x = torch.randn(MAX_PASS_ROWS + 3, 128, generator=torch.Generator().manual_seed(9))
    expected = F.linear(x, weight.dequantize())
    for rows in (x[:1], x[:MAX_GEMV_ROWS], x):  # the layer asks for int8; these formats have no int8 kernel
        torch.testing.assert_close(ggml_linear(rows, weight, None, activations="int8"), expected[: rows.shape[0]], rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="status -4"):
        kernels.gemv(x[:1], weight, None, "int8")


@pytest.mark.parametrize(("name", "activations"), [("Q4_1", "int8"), ("Q4_K", "int8"), ("Q5_0", "int8"), ("Q8_0", "int8"),
                                                   ("Q6_K", "int8"), ("Q6_K", "float32"), ("NF4", "int8")])
def test_the_compiled_product_pointer_computes_the_layer_row_by_row(kernels, name, activations):
    import ctypes

    weight = random_blocks(name, rows=40, cols=256, seed=10)
    bias = torch.randn(40, generator=torch.Generator().manual_seed(10))
    layer = GGMLLinear(weight, torch.nn.Parameter(bias, requires_grad=False), activations=activations)
    x = torch.randn(MAX_GEMV_ROWS * 2 + 3, 256, generator=torch.Generator().manual_seed(11))
    compiled = layer.compiled_product()
    assert (compiled.in_features, compiled.max_rows) == (256, MAX_PASS_ROWS)
    product = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 3)(compiled.gemm)
    y = torch.empty(x.shape[0], 40)
    product(x.data_ptr(), compiled.weight, compiled.bias, y.data_ptr(), x.shape[0], 40, 256)
    # 19 rows in chunks of 8: each row bit for bit what a one-row decode step gives it.
    with torch.inference_mode():
        one_by_one = torch.cat([layer(row[None]) for row in x])
    assert torch.equal(y, one_by_one)
    for m in range(2, MAX_GEMV_ROWS):  # every pass size the kernels specialise (a verification of 1-7 drafts)
        part = torch.empty(m, 40)
        product(x.data_ptr(), compiled.weight, compiled.bias, part.data_ptr(), m, 40, 256)
        assert torch.equal(part, one_by_one[:m]), m


def test_layer_activations_are_a_checked_setting():
    weight = random_blocks("Q4_1", rows=8, cols=64, seed=8)
    model = torch.nn.Sequential(GGMLLinear(weight), GGMLLinear(weight))
    assert [layer.activations for layer in model] == ["int8", "int8"]
    assert set_activations(model, "float32") == 2 and [layer.activations for layer in model] == ["float32", "float32"]
    with pytest.raises(ValueError, match="choose one of int8, float32"):
        GGMLLinear(weight, activations="int4")


def test_embedding_dequantizes_only_the_looked_up_rows():
    weight = random_blocks("Q8_0", rows=100, cols=64, seed=7)
    ids = torch.tensor([[3, 99], [0, 3]])
    assert torch.equal(GGMLEmbedding(weight)(ids), F.embedding(ids, weight.dequantize()))


def test_row_parts_in_different_formats_compute_the_whole_product_with_bias():
    parts = [random_blocks("Q4_K", 16, 256, seed=1), random_blocks("Q6_K", 8, 256, seed=2), random_blocks("Q5_1", 8, 256, seed=3)]
    bias = torch.nn.Parameter(torch.randn(32), requires_grad=False)
    layer = GGMLRowPartsLinear(GGMLRowParts(parts), bias)
    model = torch.nn.Sequential(layer)
    x = torch.randn(MAX_PASS_ROWS + 3, 256, generator=torch.Generator().manual_seed(5))
    weight = torch.cat([p.dequantize() for p in parts])
    with torch.inference_mode():
        assert set_activations(model, "float32") == 3  # the three parts
        exact = layer(x)
        torch.testing.assert_close(exact, F.linear(x, weight, bias), rtol=RTOL, atol=ATOL * weight.abs().sum(1).max().item())
        set_activations(model, "int8")
        rounded = F.linear(int8_rounded(x)[0], weight, bias)
        for rows in (x[:1], x):  # one kernel pass per part, and the many-row tiles
            ours = layer(rows)
            torch.testing.assert_close(ours, rounded[: rows.shape[0]], rtol=RTOL, atol=RTOL * rounded.abs().max().item())
