"""Eight-row interleaved Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K layouts: exact moves, and products equal to the GGUF layout's."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from ember.native_build import build_shared_library, cpu_fingerprint, with_local_includes
from ember.quant.ggml.blocks import dequantize_torch
from ember.quant.ggml.interleave import can_interleave, interleaved, is_interleaved, plain, rows_of
from ember.quant.ggml.kernels import MAX_GEMV_ROWS, MAX_PASS_ROWS, GGMLKernels
from ember.quant.ggml.kernels import SOURCE_PATH as GGML_SOURCE_PATH
from ember.quant.ggml.layers import GGMLLinear, ggml_linear, set_activations
from tests.quant.ggml.test_layers import RTOL, int8_rounded
from tests.quant.ggml_factory import random_blocks

NAMES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
COLS = {"Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}  # one block per row


@pytest.mark.parametrize("name", NAMES)
def test_interleaving_moves_the_bytes_and_moves_them_back(name):
    weight = random_blocks(name, rows=24, cols=COLS.get(name, 96), seed=1)
    moved = interleaved(weight)
    assert is_interleaved(moved) and moved.data.shape == weight.data.shape
    assert not torch.equal(moved.data, weight.data)
    assert sorted(moved.data.flatten().tolist()) == sorted(weight.data.flatten().tolist())
    assert torch.equal(plain(moved).data, weight.data) and plain(moved).format == weight.format
    assert plain(weight) is weight


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_a_q4_q5_group_block_holds_the_rows_fields_then_their_codes_four_bytes_per_row_at_a_time(name):
    weight = random_blocks(name, rows=8, cols=32, seed=2)  # one group, one block per row
    halves, high = (2 if name in ("Q4_1", "Q5_1") else 1), (4 if name.startswith("Q5") else 0)
    stored = interleaved(weight).data.flatten()
    for field in range(halves):  # the fp16 scales (and mins) of the eight rows, row order
        for row in range(8):
            at = 16 * field + 2 * row
            assert torch.equal(stored[at : at + 2], weight.data[row, 2 * field : 2 * field + 2])
    codes_at = 16 * halves + 8 * high
    for row in range(8):  # each row's 32 high bits (one 32-bit lane each), then code bytes 4t..4t+3 in lane `row` of load t
        at = 16 * halves + high * row
        assert torch.equal(stored[at : at + high], weight.data[row, 2 * halves : 2 * halves + high])
        for t in range(4):
            at, first = codes_at + 32 * t + 4 * row, 2 * halves + high + 4 * t
            assert torch.equal(stored[at : at + 4], weight.data[row, first : first + 4])


def test_the_first_q8_0_group_block_holds_eight_scales_then_four_code_bytes_per_row_at_a_time():
    weight = random_blocks("Q8_0", rows=8, cols=32, seed=2)
    stored = interleaved(weight).data.flatten()
    for row in range(8):
        assert torch.equal(stored[2 * row : 2 * row + 2], weight.data[row, :2])
        for t in range(8):
            at = 16 + 32 * t + 4 * row
            assert torch.equal(stored[at : at + 4], weight.data[row, 2 + 4 * t : 6 + 4 * t])


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K"])
def test_a_k_quant_group_block_holds_d_dmin_scale_words_then_four_bytes_per_row_at_a_time_in_row_order(name):
    weight = random_blocks(name, rows=8, cols=256, seed=2)
    stored = interleaved(weight).data.flatten()
    for field, (start, stop) in enumerate([(0, 2), (2, 4), (4, 8), (8, 12), (12, 16)]):  # d, dmin, three scale words
        width = stop - start
        for row in range(8):
            at = [0, 16, 32, 64, 96][field] + width * row
            assert torch.equal(stored[at : at + width], weight.data[row, start:stop])
    words = (weight.format.block_bytes - 16) // 4  # Q4_K: the codes' 32; Q5_K: its fifth bits' 8, then those 32
    for word in range(words):  # block bytes 16 + 4 * word.. of row r in lane r of load `word`
        for row in range(8):
            at = 128 + 32 * word + 4 * row
            assert torch.equal(stored[at : at + 4], weight.data[row, 16 + 4 * word : 20 + 4 * word])


def test_only_weights_of_interleaved_formats_in_whole_groups_of_eight_rows_interleave():
    assert can_interleave(random_blocks("Q4_1", rows=16, cols=32))
    assert not can_interleave(random_blocks("Q4_1", rows=12, cols=32))
    assert not can_interleave(random_blocks("NF4", rows=16, cols=64))
    with pytest.raises(ValueError, match="multiple of 8 rows"):
        interleaved(random_blocks("Q4_0", rows=12, cols=32))


@pytest.mark.parametrize("name", NAMES)
def test_rows_read_out_of_the_interleaved_layout_are_the_gguf_rows(name):
    weight = random_blocks(name, rows=24, cols=COLS.get(name, 96), seed=3)
    index = torch.tensor([0, 7, 8, 23, 9, 9, 15])
    read = rows_of(interleaved(weight), index)
    assert read.format == weight.format and torch.equal(read.data, weight.data[index])
    assert torch.equal(rows_of(weight, index).data, weight.data[index])


@pytest.mark.parametrize("name", NAMES)
def test_row_per_row_readers_refuse_the_interleaved_layout(name):
    moved = interleaved(random_blocks(name, rows=8, cols=COLS.get(name, 32)))
    with pytest.raises(ValueError, match="ggml.interleave.plain"):
        dequantize_torch(moved.data, moved.format)
    with pytest.raises(ValueError, match="ggml.interleave.plain"):
        moved.rows(torch.tensor([0]))


@pytest.mark.parametrize("name", NAMES)
def test_compiled_dequantization_of_the_interleaved_layout_is_the_gguf_one(int8_kernels, name):
    weight = random_blocks(name, rows=40, cols=256, seed=3)
    assert torch.equal(int8_kernels.dequantize(interleaved(weight)), int8_kernels.dequantize(weight))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("m", [1, 2, 3, 5, MAX_GEMV_ROWS, 2 * MAX_GEMV_ROWS + 3])
def test_interleaved_products_equal_the_gguf_layout_products(int8_kernels, name, m):
    weight = random_blocks(name, rows=48, cols=768, seed=m)
    moved = interleaved(weight)
    generator = torch.Generator().manual_seed(m)
    x, bias = torch.randn(m, 768, generator=generator) * 3, torch.randn(48, generator=generator)
    for path in ("float32", "portable"):  # these paths run the group's rows as GGUF rows: the same bits
        assert torch.equal(int8_kernels.gemv(x, moved, bias, path), int8_kernels.gemv(x, weight, bias, path))
    # int8: the same integer dot products, scaled and summed in another order.
    expected = F.linear(int8_rounded(x)[0], weight.dequantize(), bias)
    ours = int8_kernels.gemv(x, moved, bias, "int8")
    torch.testing.assert_close(ours, expected, rtol=RTOL, atol=RTOL * expected.abs().max().item())
    # A row's bits do not depend on the rows sharing its pass.
    one_by_one = torch.cat([int8_kernels.gemv(row[None], moved, bias, "int8") for row in x])
    assert torch.equal(ours, one_by_one)


def test_an_interleaved_weight_with_rows_not_in_groups_of_eight_is_refused(int8_kernels):
    moved = interleaved(random_blocks("Q4_1", rows=16, cols=64))
    with pytest.raises(ValueError, match="status -5"):
        int8_kernels.gemv_blocks(torch.randn(1, 64), moved.data[:12], moved.format.type_id, None, 12, 64, 0)


def test_int8_layers_hold_q4_interleaved_and_give_the_gguf_blocks_back(int8_kernels):
    weight = random_blocks("Q4_1", rows=64, cols=256, seed=4)
    layer, float_layer = GGMLLinear(weight), GGMLLinear(weight, activations="float32")
    assert layer.format.name == "Q4_1_X8" and float_layer.format.name == "Q4_1"
    assert torch.equal(layer.weight_blocks.data, weight.data) and layer.weight_blocks.format == weight.format
    x = torch.randn(MAX_PASS_ROWS + 7, 256, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        expected = F.linear(int8_rounded(x)[0], weight.dequantize())
        for rows in (x[:1], x[:MAX_GEMV_ROWS], x):  # the kernel, and many rows (passes or tiles, whichever this CPU runs)
            ours = layer(rows)
            torch.testing.assert_close(ours, expected[: rows.shape[0]], rtol=RTOL, atol=RTOL * expected.abs().max().item())
        # Switched to float32 activations, the interleaved layer computes what the GGUF-layout layer does, bit for bit.
        set_activations(torch.nn.Sequential(layer), "float32")
        assert torch.equal(layer(x[:5]), float_layer(x[:5]))


def test_many_row_tiles_cut_whole_groups(int8_kernels):
    weight = random_blocks("Q4_0", rows=72, cols=128, seed=6)
    x = torch.randn(MAX_PASS_ROWS + 1, 128, generator=torch.Generator().manual_seed(6))
    tiles = ggml_linear(x, interleaved(weight), None, tile_values=128 * 12, tiles=True)  # 12 rows asked: tiles of 8
    assert torch.equal(tiles, ggml_linear(x, weight, None, tile_values=128 * 12, tiles=True))


@pytest.mark.parametrize("name", NAMES)
def test_an_avx2_build_without_vnni_computes_the_same_int8_products(int8_kernels, name):
    """CPUs without VNNI run the maddubs forms (Q8_0 through |w| and sign-carrying activations): built for plain AVX2
    here and checked against the int8 reference, wherever this CPU has AVX2."""
    cpu_flags = cpu_fingerprint()
    if " avx2" not in cpu_flags or " f16c" not in cpu_flags or " fma" not in cpu_flags:
        pytest.skip("this CPU cannot run an AVX2 + FMA + F16C build")
    flags = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off")
    path = build_shared_library("ember_ggml_avx2", with_local_includes(GGML_SOURCE_PATH), flags)
    assert path is not None, "the GGML kernels no longer build for plain AVX2"
    avx2 = GGMLKernels(ctypes.CDLL(str(path)))
    cols = COLS.get(name, 96) * 2
    weight = random_blocks(name, rows=48, cols=cols, seed=3)
    for m in (1, 3, MAX_GEMV_ROWS + 3):
        x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m)) * 3
        expected = F.linear(int8_rounded(x)[0], weight.dequantize())
        ours = avx2.gemv(x, interleaved(weight), None, "int8")
        torch.testing.assert_close(ours, expected, rtol=RTOL, atol=RTOL * expected.abs().max().item())
