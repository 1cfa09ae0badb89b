"""bitsandbytes 4-bit checkpoints (tests/quant/bnb_factory.py): weights load as the values bitsandbytes computes from
their codes and states (with and without double quantization), run as transformers runs those values, and
`--quantization nf4` keeps them in NF4 blocks with the same codes; 8-bit ones are refused naming the fix."""

from __future__ import annotations

import pytest
import torch

from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from ember.models.loader import load_model
from ember.quant.ggml.layers import GGMLLinear
from ember.quant.hf.bitsandbytes import BitsAndBytesQuantization, dequantize
from tests.model_factory import load_reference, save_tiny_model
from tests.quant.bnb_factory import quantize, write_checkpoint

PROMPTS = [[5, 9, 200, 17, 3], list(range(30, 53))]
NAME = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("bnb-src"), dtype="bfloat16")


@pytest.mark.parametrize("nested", [False, True])
def test_a_bitsandbytes_checkpoint_runs_as_transformers_does_on_the_values_it_stands_for(source, tmp_path, nested):
    weights = write_checkpoint(source, tmp_path / "q", nested)
    assert torch.equal(load_model(tmp_path / "q", "auto").model.state_dict()[NAME], weights[NAME])
    reference = load_reference(source)
    reference.load_state_dict(weights)
    llm = LLM(str(tmp_path / "q"), block_size=4, num_kv_blocks=128)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        with torch.no_grad():
            expected = torch.log_softmax(reference(torch.tensor([prompt])).logits[0], dim=-1)
        ours = torch.tensor([output.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
        theirs = torch.tensor([float(expected[i - 1, prompt[i]]) for i in range(1, len(prompt))])
        assert (ours - theirs).abs().max() <= 1e-4


def test_nf4_at_load_keeps_the_checkpoints_codes_in_nf4_blocks(source, tmp_path):
    weights = write_checkpoint(source, tmp_path / "q", nested=True)
    layer = load_model(tmp_path / "q", "auto", quantization="nf4").model.get_submodule(NAME.removesuffix(".weight"))
    assert isinstance(layer, GGMLLinear) and layer.weight_blocks.format.name == "NF4"
    expected = weights[NAME]
    assert (layer.weight_blocks.dequantize() - expected).abs().max() <= 2**-7 * expected.abs().max()  # bfloat16 steps


def test_dequantization_equals_bitsandbytes_own():
    bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed: the reference dequantization is not run")
    weight = torch.randn(3, 192, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for nested in (False, True):
        for quant_type in ("nf4", "fp4"):
            packed, state = bnb.functional.quantize_4bit(weight, blocksize=64, quant_type=quant_type, compress_statistics=nested)
            saved = state.as_dict(packed=True)
            parts = {"codes": packed, "quant_state": saved.pop(f"quant_state.bitsandbytes__{quant_type}"), **saved}
            assert torch.equal(dequantize(parts, "w"), bnb.functional.dequantize_4bit(packed, state).float())


def test_our_factory_agrees_with_the_reader_and_8_bit_is_refused():
    weight = torch.randn(4, 128, generator=torch.Generator().manual_seed(1))
    state, values = quantize(weight, nested=True)
    parts = {"codes": state.pop(""), "quant_state": state.pop("quant_state.bitsandbytes__nf4"), **state}
    assert torch.equal(dequantize(parts, "w"), values)
    with pytest.raises(ValueError, match="--quantization int8"):
        BitsAndBytesQuantization.from_config({"quant_method": "bitsandbytes", "load_in_8bit": True})
