"""8-bit checkpoints with float scales (tests/quant/scaled_factory.py): FP8 weights load as the exact float values
their codes and scales stand for, W8A8 int8 ones as ember's W8A8 layers, packed int4 / int8 ones (W4A16) as blocks
holding exactly their values, and layouts ember cannot read are refused with the fix named."""

from __future__ import annotations

import pytest
import torch

from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from ember.models.loader import load_model
from ember.quant.hf.scaled import ScaledQuantization
from ember.quant.int8.w8a8_layers import W8A8Linear
from tests.model_factory import load_reference, save_tiny_model
from tests.quant.scaled_factory import compressed_tensors_config, write_checkpoint

LOGIT_TOLERANCE = 1e-4
PROMPTS = [[5, 9, 200, 17, 3], list(range(30, 53)), list(range(100, 140))]
FP8_LAYOUTS = {
    "fp8-block": ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32]}, "block", "weight_scale_inv"),
    "ct-fp8-channel": (compressed_tensors_config("float", "channel", False), "channel", "weight_scale"),
    "ct-fp8-tensor": (compressed_tensors_config("float", "tensor", False), "tensor", "weight_scale"),
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return save_tiny_model("qwen2", tmp_path_factory.mktemp("scaled-src"))  # qwen2: float biases beside q, k, v


@pytest.mark.parametrize("layout", list(FP8_LAYOUTS))
def test_fp8_checkpoints_run_as_transformers_does_on_the_weights_they_stand_for(source, tmp_path, layout):
    config, strategy, scale_name = FP8_LAYOUTS[layout]
    weights = write_checkpoint(source, tmp_path / "q", config, "float", strategy, scale_name=scale_name)
    reference = load_reference(source)
    reference.load_state_dict(weights)
    loaded = load_model(tmp_path / "q", "auto").model
    assert torch.equal(loaded.state_dict()["model.layers.1.mlp.down_proj.weight"], weights["model.layers.1.mlp.down_proj.weight"])
    llm = LLM(str(tmp_path / "q"), block_size=4, num_kv_blocks=128)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, params), strict=True):
        with torch.no_grad():
            expected = torch.log_softmax(reference(torch.tensor([prompt])).logits[0], dim=-1)
        ours = torch.tensor([output.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
        theirs = torch.tensor([float(expected[i - 1, prompt[i]]) for i in range(1, len(prompt))])
        assert (ours - theirs).abs().max() <= LOGIT_TOLERANCE


def test_a_w8a8_checkpoint_loads_ember_w8a8_layers_with_its_codes_and_scales(source, tmp_path):
    weights = write_checkpoint(source, tmp_path / "q", compressed_tensors_config("int", "channel", True), "int", "channel")
    model = load_model(tmp_path / "q", "auto").model
    layer = model.model.layers[0].mlp.down_proj
    assert isinstance(layer, W8A8Linear) and isinstance(model.model.layers[1].self_attn.qkv_proj, W8A8Linear)
    assert torch.equal(layer.weight_tensor.dequantize(), weights["model.layers.0.mlp.down_proj.weight"])
    as_float = load_model(tmp_path / "q", "float32").model.state_dict()
    assert torch.equal(as_float["model.layers.0.mlp.down_proj.weight"], weights["model.layers.0.mlp.down_proj.weight"])
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    assert len(LLM(str(tmp_path / "q"), block_size=4, num_kv_blocks=128).generate(PROMPTS, params)[0].outputs[0].token_ids) == 12


def test_int8_weights_without_int8_activations_load_as_their_float_values(source, tmp_path):
    weights = write_checkpoint(source, tmp_path / "q", compressed_tensors_config("int", "channel", False), "int", "channel")
    state = load_model(tmp_path / "q", "auto").model.state_dict()
    assert torch.equal(state["model.layers.0.mlp.down_proj.weight"], weights["model.layers.0.mlp.down_proj.weight"])


@pytest.mark.parametrize(("config", "fix"), [
    ({"quant_method": "compressed-tensors", "format": "int-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}},
     "8-bit symmetric float"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False}}}},
     "symmetric int4 or int8"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "two positive integers"),
    ({"quant_method": "hqq"}, "'fp8'"),
])
def test_layouts_ember_cannot_read_are_refused_naming_the_fix(config, fix):
    from ember.quant.hf.gptq_awq import HFQuantization

    parse = ScaledQuantization.from_config if config["quant_method"] != "hqq" else HFQuantization.from_config
    with pytest.raises(ValueError, match=fix):
        parse(config)


def test_an_fp8_checkpoint_rounded_again_at_load_keeps_one_byte_a_weight(source, tmp_path):
    from ember.quant.ggml.layers import GGMLLinear

    config, strategy, scale_name = FP8_LAYOUTS["ct-fp8-channel"]
    weights = write_checkpoint(source, tmp_path / "q", config, "float", strategy, scale_name=scale_name)
    layer = load_model(tmp_path / "q", "auto", quantization="fp8").model.model.layers[0].mlp.down_proj
    assert isinstance(layer, GGMLLinear) and layer.weight_blocks.format.name == "FP8"
    expected = weights["model.layers.0.mlp.down_proj.weight"]
    assert (layer.weight_blocks.dequantize() - expected).abs().max() <= 0.07 * expected.abs().max()  # e4m3's 3 mantissa bits


@pytest.mark.parametrize(("bits", "group_size", "scale_dtype", "kind"), [
    (4, 64, torch.float16, "Q4_0"), (4, None, torch.bfloat16, "Q4_0"), (8, 32, torch.float16, "Q8_0"),
    (4, 16, torch.float16, None),  # groups smaller than a 32-value block: float32
])  # fmt: skip
def test_packed_int_checkpoints_load_as_blocks_holding_exactly_their_weights(source, tmp_path, bits, group_size, scale_dtype, kind):
    from ember.quant.ggml.layers import GGMLLinear
    from tests.quant.scaled_factory import write_packed_checkpoint

    weights = write_packed_checkpoint(source, tmp_path / "q", bits, group_size, scale_dtype)
    model = load_model(tmp_path / "q", "auto").model
    layer = model.model.layers[1].mlp.down_proj
    if kind is None:
        as_float = load_model(tmp_path / "q", "float32").model.state_dict()["model.layers.1.mlp.down_proj.weight"]
        assert not isinstance(layer, GGMLLinear) and torch.equal(as_float, weights["model.layers.1.mlp.down_proj.weight"])
    else:
        assert isinstance(layer, GGMLLinear) and layer.weight_blocks.format.name == kind
        assert torch.equal(layer.weight_blocks.dequantize(), weights["model.layers.1.mlp.down_proj.weight"])
    reference = load_reference(source)
    reference.load_state_dict(weights)
    llm = LLM(str(tmp_path / "q"), quant_activations="float32", block_size=4, num_kv_blocks=128)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    for prompt, output in zip(PROMPTS, llm.generate(PROMPTS, params), strict=True):
        with torch.no_grad():
            expected = torch.log_softmax(reference(torch.tensor([prompt])).logits[0], dim=-1)
        ours = torch.tensor([output.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))])
        assert (ours - torch.tensor([float(expected[i - 1, prompt[i]]) for i in range(1, len(prompt))])).abs().max() <= LOGIT_TOLERANCE
