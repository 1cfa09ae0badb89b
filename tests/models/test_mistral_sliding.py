"""Mistral (window on every layer) and Qwen2 with sliding layers (hybrid) against transformers."""

from __future__ import annotations

import pytest
import transformers

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams

from tests.models.family_parity import (
    assert_greedy_matches,
    assert_prompt_logits_match,
    load_reference,
    make_prompts,
    save_random_model,
)

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
WINDOW = 12


def _mistral(folder):
    config = transformers.MistralConfig(**TINY, num_hidden_layers=2, sliding_window=WINDOW)
    return save_random_model(transformers.MistralForCausalLM, config, folder)


def _qwen2_hybrid(folder):
    config = transformers.Qwen2Config(
        **TINY, num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    )
    return save_random_model(transformers.Qwen2ForCausalLM, config, folder)


@pytest.fixture(scope="module", params=[_mistral, _qwen2_hybrid], ids=["mistral", "qwen2-hybrid"])
def model_folder(request, tmp_path_factory):
    return request.param(tmp_path_factory.mktemp("sliding"))


def test_prompt_logits_match_transformers_past_the_window(model_folder):
    reference = load_reference(model_folder)
    assert_prompt_logits_match(model_folder, reference, make_prompts(256))


def test_greedy_generation_past_the_window_matches_transformers(model_folder):
    reference = load_reference(model_folder)
    assert_greedy_matches(model_folder, reference, make_prompts(256))


def test_a_windowed_request_holds_window_plus_one_block_while_decoding_ten_windows(tmp_path):
    folder = _mistral(tmp_path)
    engine = LLMEngine(EngineConfig(model=str(folder), cache=CacheConfig(block_size=4, num_kv_blocks=64)))
    engine.add_request("r", list(range(10)), SamplingParams(temperature=0, max_tokens=10 * WINDOW, ignore_eos=True))
    most_held = 0
    while engine.has_unfinished_requests():
        engine.step()
        if "r#0" in engine.kv.tables:
            most_held = max(most_held, engine.kv.block_table("r#0").num_held_blocks)
    assert most_held <= -(-WINDOW // 4) + 1
    assert engine.kv.num_free_blocks == 64
