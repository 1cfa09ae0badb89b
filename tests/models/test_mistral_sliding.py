"""Mistral (window on every layer) and Qwen2 with sliding layers (hybrid) against transformers."""

from __future__ import annotations

import pytest
import transformers

from ember.engine.config import CacheConfig, EngineConfig
from ember.engine.engine_request import EngineRequest
from ember.engine.llm_engine import LLMEngine
from ember.engine.sampling_params import SamplingParams
from ember.llm import LLM
from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    NUM_GENERATED,
    assert_greedy_matches,
    assert_prompt_logits_match,
    load_reference,
    make_prompts,
    reference_greedy,
    save_random_model,
    single_thread_torch,
)

pytestmark = pytest.mark.usefixtures("single_thread_torch")

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
    llm = assert_greedy_matches(model_folder, reference, make_prompts(256))
    # The batched run found the 23-token prompt of the solo run in the prefix cache, across the window.
    assert llm.engine.kv.prefix_stats.hits >= 20


@pytest.mark.parametrize("make_model", [_mistral, _qwen2_hybrid], ids=["mistral", "qwen2-hybrid"])
def test_a_windowed_request_holds_window_plus_one_block_while_decoding_ten_windows(tmp_path, make_model):
    folder = make_model(tmp_path)
    engine = LLMEngine(EngineConfig(model=str(folder), cache=CacheConfig(block_size=4, num_kv_blocks=80)))
    engine.add_request(EngineRequest("r", list(range(10)), SamplingParams(temperature=0, max_tokens=10 * WINDOW, ignore_eos=True)))
    windowed = engine.kv.group_windows.index(WINDOW)
    most_held = [0] * len(engine.kv.group_windows)
    while engine.has_unfinished_requests():
        engine.step()
        if "r#0" in engine.kv.tables:
            for group, table in enumerate(engine.kv.block_tables("r#0")):
                most_held[group] = max(most_held[group], table.num_held_blocks)
    assert most_held[windowed] <= -(-WINDOW // 4) + 1
    if len(most_held) == 2:  # the hybrid's global layer keeps every block (128 tokens before the last step)
        assert most_held[1 - windowed] == -(-(10 + 10 * WINDOW - 2) // 4)
    assert engine.kv.num_free_blocks == 80


def test_preempted_and_forked_windowed_requests_still_match_and_give_every_block_back(tmp_path):
    folder = _mistral(tmp_path)
    reference = load_reference(folder)
    prompts = make_prompts(256)
    expected = [reference_greedy(reference, prompt) for prompt in prompts]
    # 14 blocks cannot hold four windowed requests at once (each holds up to 6 while prefilling).
    llm = LLM(str(folder), block_size=4, num_kv_blocks=14, max_num_batched_tokens=7)
    greedy = SamplingParams(temperature=0, max_tokens=NUM_GENERATED, ignore_eos=True)
    outputs = llm.generate(prompts, greedy)
    assert [out.outputs[0].token_ids for out in outputs] == expected
    assert llm.engine.stats().num_preemptions > 0
    forked = llm.generate([prompts[3]], SamplingParams(n=3, temperature=0, max_tokens=NUM_GENERATED, ignore_eos=True))
    assert [completion.token_ids for completion in forked[0].outputs] == [expected[3]] * 3
    assert llm.engine.kv.num_free_blocks == 14
