"""The compiled CPU GEMM over packed weights against torch's product (the reference), and Linear's use of it."""

from __future__ import annotations

import ctypes
import platform

import pytest
import torch
import torch.nn.functional as F

from ember.layers import cpu_gemm
from ember.layers.linear import Linear, pack_linear_weights


@pytest.fixture(scope="module")
def gemm():
    kernel = cpu_gemm.load_gemm()
    if kernel is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set): the kernel is unavailable")
    return kernel


# Shapes cover partial panels (n % 16), k tails past the L1 slice, and every row count mod 6.
@pytest.mark.parametrize(("rows", "cols"), [(960, 576), (37, 63), (5, 4500), (16, 1)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 17, 64, 70])
@pytest.mark.parametrize("with_bias", [False, True])
def test_float32_gemm_matches_torch_linear(gemm, rows, cols, m, with_bias):
    generator = torch.Generator().manual_seed(rows + cols + m)
    weight = torch.randn(rows, cols, generator=generator)
    bias = torch.randn(rows, generator=generator) if with_bias else None
    x = torch.randn(m, cols, generator=generator)
    ours = gemm(x, cpu_gemm.PackedWeight.from_dense(weight, bias))
    assert torch.allclose(ours, F.linear(x, weight, bias), rtol=1e-4, atol=1e-4 * cols**0.5)


@pytest.mark.parametrize("m", [1, 4, 17])
@pytest.mark.parametrize("cols", [576, 63])
def test_bfloat16_weights_are_widened_exactly_and_summed_in_float32(gemm, m, cols):
    """Products of bfloat16 weights are exact in float32; with AVX512-BF16 the activations are rounded to bfloat16 first."""
    generator = torch.Generator().manual_seed(m)
    weight = torch.randn(300, cols, generator=generator).bfloat16()
    x = torch.randn(m, cols, generator=generator)
    ours = gemm(x, cpu_gemm.PackedWeight.from_dense(weight))
    assert ours.dtype == torch.float32
    activations = x.bfloat16().float() if gemm.bfloat16_pairs else x
    assert torch.allclose(ours, F.linear(activations, weight.float()), rtol=1e-4, atol=1e-3)
    if gemm.bfloat16_pairs:  # the rounding is really there: the unrounded product is farther off
        assert not torch.allclose(ours, F.linear(x, weight.float()), rtol=1e-4, atol=1e-3)


def _build(extra_flag: str):
    from ember.native_build import CPU_KERNEL_FLAGS, load_cpu_kernels

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the narrower builds are x86 instruction-set flags")
    library = load_cpu_kernels(f"ember_gemm{extra_flag.replace('-', '_')}", cpu_gemm.SOURCE_PATH, (*CPU_KERNEL_FLAGS, extra_flag))
    assert library is not None
    return library


def _run(function, x: torch.Tensor, packed: cpu_gemm.PackedWeight) -> torch.Tensor:
    y = torch.empty(x.shape[0], packed.out_features)
    function(*(ctypes.c_void_p(t.data_ptr()) for t in (x, packed.panels, packed.bias, y)),
             *(ctypes.c_int64(v) for v in (x.shape[0], packed.out_features, packed.in_features)))
    return y


@pytest.mark.parametrize("m", [1, 5, 16, 23])
def test_builds_for_narrower_cpus_give_the_same_bits(gemm, m):
    """AVX-512 walks a panel row in one register (bfloat16 in its lane order), AVX2 in two: each output sums in the
    same order, so the same bits. On an AVX2 CPU the builds are alike and this checks nothing new."""
    avx2, avx512_without_bf16 = _build("-mno-avx512f"), _build("-mno-avx512bf16")
    generator = torch.Generator().manual_seed(m)
    weight, bias = torch.randn(203, 300, generator=generator), torch.randn(203, generator=generator)
    x = torch.randn(m, 300, generator=generator)
    packed = cpu_gemm.PackedWeight.from_dense(weight, bias)
    assert torch.equal(_run(avx2.ember_gemm_f32, x, packed), gemm(x, packed))
    columns = cpu_gemm.PackedWeight.from_dense(weight.bfloat16(), bias, bf16_pairs=False)
    assert torch.equal(_run(avx2.ember_gemm_bf16, x, columns), _run(avx512_without_bf16.ember_gemm_bf16, x, columns))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "cols"), [(960, 576), (64 * 7 + 16, 300), (50, 2000)])
def test_a_rows_result_does_not_depend_on_the_batch_it_is_in(gemm, dtype, rows, cols):
    """Up to 16 rows walk groups of panels a few rows per pass, more rows one panel at a time: the same bits either way.

    Batch invariance is what keeps greedy decoding identical whether a sequence runs alone or
    with others (and with or without speculative verification, which scores K+1 rows at once).
    """
    generator = torch.Generator().manual_seed(rows)
    packed = cpu_gemm.PackedWeight.from_dense(torch.randn(rows, cols, generator=generator).to(dtype),
                                              torch.randn(rows, generator=generator))
    x = torch.randn(20, cols, generator=generator)
    batched = gemm(x, packed)
    tile_rows = gemm.bfloat16_tile_rows if dtype == torch.bfloat16 else None
    for start, stop in [(0, 1), (3, 5), (2, 5), (0, 4), (4, 9), (1, 9), (2, 18), (19, 20)]:
        alone = gemm(x[start:stop], packed)
        if tile_rows is None or stop - start >= tile_rows:  # the same path as the batch of 20: the same bits
            assert torch.equal(alone, batched[start:stop]), (start, stop)
        else:  # few rows walk the panels while the batch ran on AMX tiles: float32 summation order apart
            assert torch.allclose(alone, batched[start:stop], rtol=1e-5, atol=1e-5 * cols), (start, stop)


@pytest.mark.parametrize(("rows", "cols"), [(960, 576), (37, 63), (50, 100), (33, 1000), (16, 32)])
@pytest.mark.parametrize("m", [4, 5, 31, 32, 33, 70])
def test_amx_tiles_give_the_rounded_product(gemm, rows, cols, m):
    """On AMX the bfloat16 product of 4+ rows runs on tiles: odd shapes (k not a multiple of 32, outputs not of
    32, rows not of 32) give the product of the bfloat16-rounded activations, within float32 summation rounding."""
    if gemm.bfloat16_tile_rows is None:
        pytest.skip("this CPU (or its kernel build) has no AMX tiles")
    generator = torch.Generator().manual_seed(rows * m + cols)
    weight, bias = torch.randn(rows, cols, generator=generator).bfloat16(), torch.randn(rows, generator=generator)
    x = torch.randn(m, cols, generator=generator)
    ours = gemm(x, cpu_gemm.PackedWeight.from_dense(weight, bias))
    reference = F.linear(x.bfloat16().double(), weight.double(), bias.double()).float()
    assert torch.allclose(ours, reference, rtol=1e-5, atol=1e-6 * cols)
    assert not torch.allclose(ours, F.linear(x, weight.float(), bias), rtol=1e-5, atol=1e-6 * cols)  # rounded inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_rows_give_back_the_dense_weight(dtype):
    weight = torch.randn(45, 7).to(dtype)
    packed = cpu_gemm.PackedWeight.from_dense(weight)
    assert torch.equal(packed.dense(), weight)
    ids = torch.tensor([[44, 0], [17, 8]])
    assert torch.equal(packed.rows(ids), weight[ids])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_gives_the_torch_result_and_keeps_one_copy(gemm, dtype):
    torch.manual_seed(0)
    layer = Linear(64, 96, bias=True).to(dtype)
    dense_weight, dense_bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    x = torch.randn(3, 5, 64).to(dtype)
    with torch.inference_mode():
        expected = F.linear(x.float(), dense_weight.float(), dense_bias.float())
        assert pack_linear_weights(layer) == 1
        ours = layer(x)
    assert layer.weight is None and list(layer.parameters()) == []  # the panels replaced the dense copy
    assert ours.shape == (3, 5, 96) and ours.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(ours.float(), expected, rtol=tolerance, atol=tolerance)


def test_layers_stay_plain_torch_where_the_kernel_cannot_run(gemm):
    half = Linear(8, 8).half()
    assert not half.pack_weights() and half.packed is None and half.weight is not None


def test_a_packed_layer_still_reports_its_dense_weights_in_the_state_dict(gemm):
    layer = Linear(20, 33, bias=True)
    before = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    assert layer.pack_weights()
    after = layer.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_restoring_dense_weights_gives_back_the_plain_layer(gemm):
    from ember.layers.cpu_prepare import restore_dense_weights

    layer = Linear(20, 33, bias=True)
    before = {name: tensor.clone() for name, tensor in layer.state_dict().items()}
    assert layer.pack_weights()
    restore_dense_weights(layer)
    assert layer.packed is None and torch.equal(layer.weight, before["weight"]) and torch.equal(layer.bias, before["bias"])
