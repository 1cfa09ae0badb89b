"""GGML block decoding against the `gguf` package (the reference): bit-exact, every executed type."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from ember.quant.ggml.blocks import FORMATS, GGUF_FORMATS, GGMLTensor, as_q8_0, dequantize_torch
from ember.quant.ggml.kernels import load_kernels
from tests.quant.ggml_factory import random_blocks


def _reference(weight: GGMLTensor) -> np.ndarray:
    return dequantize(weight.data.numpy(), GGMLQuantizationType[weight.format.name]).reshape(weight.shape)


@pytest.mark.parametrize("name", GGUF_FORMATS)
def test_torch_decoder_is_bit_exact_with_gguf(name):
    weight = random_blocks(name, rows=24, cols=512, seed=1)
    ours = dequantize_torch(weight.data, weight.format).reshape(weight.shape).numpy()
    assert np.array_equal(ours.view(np.uint32), _reference(weight).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("name", GGUF_FORMATS)
def test_compiled_decoder_is_bit_exact_with_gguf(name):
    kernels = load_kernels()
    if kernels is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set)")
    weight = random_blocks(name, rows=37, cols=768, seed=2)
    ours = kernels.dequantize(weight).numpy()
    assert np.array_equal(ours.view(np.uint32), _reference(weight).astype(np.float32).view(np.uint32))


def test_concat_stacks_rows_and_refuses_mixed_formats():
    q, k = random_blocks("Q4_1", 8, 64, seed=3), random_blocks("Q4_1", 4, 64, seed=4)
    fused = GGMLTensor.concat([q, k])
    assert fused.shape == (12, 64)
    assert torch.equal(fused.dequantize(), torch.cat([q.dequantize(), k.dequantize()]))
    with pytest.raises(ValueError, match="share one format"):
        GGMLTensor.concat([q, random_blocks("Q8_0", 4, 64)])


def test_a_width_that_is_not_whole_blocks_is_refused_with_the_block_size():
    with pytest.raises(ValueError, match="whole 256-value blocks"):
        GGMLTensor(torch.zeros(2, 144, dtype=torch.uint8), FORMATS["Q4_K"], 300)


@pytest.mark.parametrize("name", ["NF4", "FP8"])
def test_compiled_decoder_of_ember_formats_is_bit_exact_with_the_torch_decoder(name):
    kernels = load_kernels()
    if kernels is None:
        pytest.skip("no C compiler here (or EMBER_PURE_TORCH is set)")
    weight = random_blocks(name, rows=21, cols=576, seed=3)
    ours = kernels.dequantize(weight).numpy()
    assert np.array_equal(ours.view(np.uint32), dequantize_torch(weight.data, weight.format).reshape(weight.shape).numpy().view(np.uint32))


@pytest.mark.parametrize("name", ["Q4_0", "Q5_0", "Q8_0"])
def test_symmetric_formats_become_q8_0_with_the_same_values(name):
    weight = random_blocks(name, rows=8, cols=128, seed=3)
    widened = as_q8_0(weight)
    assert widened.format.name == "Q8_0" and widened.shape == weight.shape
    assert torch.equal(dequantize_torch(widened.data, widened.format), dequantize_torch(weight.data, weight.format))


def test_formats_with_a_min_do_not_become_q8_0():
    with pytest.raises(ValueError, match="are Q8_0 blocks exactly"):
        as_q8_0(random_blocks("Q5_1", rows=8, cols=32))
