"""Offline `LLM.generate` without sampling params takes the model folder's generation_config.json, as vLLM's LLM does
(`get_default_sampling_params`); `generation_config="vllm"` keeps SamplingParams' own defaults."""

from __future__ import annotations

import json

from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from tests.model_factory import save_tiny_model


def test_generate_without_params_samples_as_the_models_generation_config_says(tmp_path):
    folder = save_tiny_model("llama", tmp_path / "m")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "temperature": 0.0, "top_k": 7, "max_new_tokens": 5}))
    llm = LLM(str(folder), block_size=4, num_kv_blocks=64)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens, defaults.top_p) == (0.0, 7, 5, 1.0)
    prompt = list(range(5, 20))
    untold = llm.generate([prompt])[0].outputs[0].token_ids
    greedy = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=5))[0].outputs[0].token_ids
    assert untold == greedy and len(untold) <= 5
    plain = LLM(str(folder), block_size=4, num_kv_blocks=64, generation_config="vllm").get_default_sampling_params()
    assert (plain.temperature, plain.max_tokens) == (SamplingParams().temperature, SamplingParams().max_tokens)
