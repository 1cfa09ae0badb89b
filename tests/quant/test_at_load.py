"""`--quantization` rounds a float checkpoint's decoder linears as it loads (vLLM's in-flight quantization): each
becomes a block layer of the asked format holding exactly the rounded weight, the LM head and embeddings stay float,
the model runs near the float one, and bad combinations are refused naming the fix."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from ember.engine.config import EngineConfig, add_engine_arguments
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from ember.models.loader import load_model
from ember.quant.at_load import AT_LOAD_QUANTIZERS, decoder_linears
from ember.quant.ggml.layers import GGMLLinear
from tests.model_factory import save_tiny_model

FORMATS = {"int8": "Q8_0", "int4": "Q4_1", "fp8": "FP8", "nf4": "NF4"}
PROMPT = list(range(5, 45))


@pytest.fixture(scope="module")
def float_folder(tmp_path_factory):
    return save_tiny_model("mixtral", tmp_path_factory.mktemp("at-load"))  # experts too; its widths take every format


def _prompt_logprobs(llm: LLM) -> torch.Tensor:
    output = llm.generate([PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    return torch.tensor([output.prompt_logprobs[i][PROMPT[i]].logprob for i in range(1, len(PROMPT))])


@pytest.mark.parametrize("quantization", list(FORMATS))
def test_every_decoder_linear_holds_its_rounded_weight_and_the_head_stays_float(float_folder, quantization):
    float_model = load_model(float_folder, "float32").model
    float_weights = float_model.state_dict()
    model = load_model(float_folder, "auto", quantization=quantization).model
    names = decoder_linears(float_model)
    assert any(".experts." in name for name in names)
    for name in names:
        layer = model.get_submodule(name)
        assert isinstance(layer, GGMLLinear) and layer.weight_blocks.format.name == FORMATS[quantization]
    expected = AT_LOAD_QUANTIZERS[quantization](float_weights["model.layers.1.self_attn.qkv_proj.weight"]).dequantize()
    assert torch.equal(model.get_submodule("model.layers.1.self_attn.qkv_proj").weight_blocks.dequantize(), expected)
    assert not isinstance(model.lm_head, GGMLLinear) and model.model.embed_tokens.weight.dtype == torch.float32
    assert not isinstance(model.model.layers[0].block_sparse_moe.gate, GGMLLinear)  # the router stays float


def test_eight_bit_weights_run_near_the_float_model_and_four_bit_further(float_folder):
    plain = _prompt_logprobs(LLM(str(float_folder), block_size=4, num_kv_blocks=128))
    drift = {q: float((_prompt_logprobs(LLM(str(float_folder), block_size=4, num_kv_blocks=128, quantization=q,
                                            quant_activations="float32")) - plain).abs().mean()) for q in ("int8", "int4")}
    assert drift["int8"] < 0.01 and drift["int8"] < drift["int4"]


def test_vllm_spellings_and_bad_combinations(float_folder, tmp_path):
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert EngineConfig.from_args(parser.parse_args(["--model", "m", "-q", "bitsandbytes"])).quantization == "nf4"
    with pytest.raises(ValueError, match="use --dtype auto or float32"):
        EngineConfig(model="m", dtype="bfloat16", quantization="fp8")
    with pytest.raises(ValueError, match="choose one of"):
        EngineConfig(model="m", quantization="int3")
    with pytest.raises(ValueError, match="holds float weights"):
        LLM(str(float_folder), quantization="awq")
    from tests.models.test_gguf_loader import write_gguf

    llama = save_tiny_model("llama", tmp_path / "llama")
    write_gguf(llama, tmp_path / "q8.gguf", GGMLQuantizationType.Q8_0, np.random.default_rng(0))
    model = LLM(str(tmp_path / "q8.gguf"), quantization="gguf", block_size=4, num_kv_blocks=64).engine.runner.model
    assert isinstance(model.model.layers[0].mlp.down_proj, GGMLLinear)  # a checkpoint format's name changes nothing
