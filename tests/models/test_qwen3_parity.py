"""Qwen3 (Llama blocks with an RMSNorm on every query and key head) against transformers."""

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
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # Qwen3 sets head_dim apart from hidden / heads (here 32, not 16)
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return save_random_model(transformers.Qwen3ForCausalLM, config, tmp_path_factory.mktemp("qwen3"))


def test_prompt_logits_match_transformers(model_folder):
    assert_prompt_logits_match(model_folder, load_reference(model_folder), make_prompts(VOCAB))


def test_greedy_generation_matches_transformers_and_the_head_norms_are_loaded(model_folder):
    llm = assert_greedy_matches(model_folder, load_reference(model_folder), make_prompts(VOCAB))
    attention = llm.engine.runner.model.model.layers[0].self_attn
    assert attention.q_norm.weight.shape == (32,) and attention.k_norm.weight.shape == (32,)
    assert float((attention.q_norm.weight - 1).abs().max()) > 0  # the checkpoint's weights, not the initial ones
