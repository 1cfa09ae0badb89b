"""Gemma 2 (alternating local/global layers, soft-capping, four norms) and Gemma (1) against transformers."""

from __future__ import annotations

import pytest
import transformers

from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    assert_greedy_matches,
    assert_prompt_logits_match,
    load_reference,
    make_prompts,
    save_random_model,
    single_thread_torch,
)

pytestmark = pytest.mark.usefixtures("single_thread_torch")

VOCAB = 256


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    config = transformers.Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=12,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=1.0,  # small caps so the tanh really bends the tiny model's scores
        final_logit_softcapping=2.0,
        attn_implementation="eager",
    )
    return save_random_model(transformers.Gemma2ForCausalLM, config, tmp_path_factory.mktemp("gemma2"))


def test_prompt_logits_match_transformers_past_the_window(model_folder):
    assert_prompt_logits_match(model_folder, load_reference(model_folder), make_prompts(VOCAB))


def test_greedy_generation_past_the_window_matches_transformers(model_folder):
    llm = assert_greedy_matches(model_folder, load_reference(model_folder), make_prompts(VOCAB))
    assert llm.engine.kv.group_windows == (12, None)


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    """Gemma (1): two norms a block, no windows or soft-capping; one KV head (MQA, as Gemma-2B)."""
    config = transformers.GemmaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=256)
    return save_random_model(transformers.GemmaForCausalLM, config, tmp_path_factory.mktemp("gemma"))


def test_gemma_prompt_logits_and_greedy_generation_match_transformers(gemma_folder):
    reference = load_reference(gemma_folder)
    assert_prompt_logits_match(gemma_folder, reference, make_prompts(VOCAB))
    assert_greedy_matches(gemma_folder, reference, make_prompts(VOCAB))


@pytest.fixture(scope="module")
def gemma3_folder(tmp_path_factory):
    """Gemma 3 (text): five sliding layers to one global, q/k head norms, a rotary base per layer type."""
    config = transformers.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=12,
                                           query_pre_attn_scalar=16, max_position_embeddings=256,
                                           eos_token_id=None)  # transformers' min_new_tokens would hold EOS back
    return save_random_model(transformers.Gemma3ForCausalLM, config, tmp_path_factory.mktemp("gemma3"))


def test_gemma3_prompt_logits_and_greedy_generation_past_the_window_match_transformers(gemma3_folder):
    reference = load_reference(gemma3_folder)
    assert_prompt_logits_match(gemma3_folder, reference, make_prompts(VOCAB))
    llm = assert_greedy_matches(gemma3_folder, reference, make_prompts(VOCAB))
    assert llm.engine.kv.group_windows == (12, None)
    model = llm.engine.runner.model
    assert model.local_rotary is not None and model.config.local_rope_theta == 10_000.0 and model.config.rope_theta == 1e6


def test_a_gemma3_config_in_transformers_4s_spelling_reads_the_same():
    """rope_theta / rope_local_base_freq / sliding_window_pattern (as the published Gemma 3 configs still read) give the
    layers, windows and bases that transformers 5's rope_parameters and layer_types give."""
    from ember.models.config import ModelConfig

    current = transformers.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=7,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=12).to_dict()
    older = {k: v for k, v in current.items() if k not in ("rope_parameters", "layer_types")}
    older.update(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, rope_scaling=None, sliding_window_pattern=6)
    new, old = ModelConfig.from_hf(current), ModelConfig.from_hf(older)
    assert old == new
    assert new.layer_windows == (12, 12, 12, 12, 12, None, 12)
    assert (new.rope_theta, new.local_rope_theta) == (1_000_000.0, 10_000.0)
