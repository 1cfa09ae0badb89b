"""GPT-2 (learned positions, LayerNorm, Conv1D weights) and MQA (Llama-shaped and Falcon) against transformers."""

from __future__ import annotations

import pytest
import transformers

from ember.kv.specs import FullAttentionSpec
from ember.kv.tensors import kv_cache_layout
from ember.models.loader import load_model
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


def _gpt2(folder):
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0
    )
    return save_random_model(transformers.GPT2LMHeadModel, config, folder)


def _llama_mqa(folder):
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    return save_random_model(transformers.LlamaForCausalLM, config, folder)


def _falcon_mqa(folder):
    config = transformers.FalconConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        multi_query=True,
        parallel_attn=True,
        new_decoder_architecture=False,
        alibi=False,
        bias=False,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=0,
    )
    return save_random_model(transformers.FalconForCausalLM, config, folder)


@pytest.fixture(scope="module", params=[_gpt2, _llama_mqa, _falcon_mqa], ids=["gpt2", "llama-mqa", "falcon-mqa"])
def model_folder(request, tmp_path_factory):
    return request.param(tmp_path_factory.mktemp("family"))


def test_prompt_logits_match_transformers(model_folder):
    assert_prompt_logits_match(model_folder, load_reference(model_folder), make_prompts(VOCAB))


def test_greedy_generation_matches_transformers_alone_and_batched(model_folder):
    assert_greedy_matches(model_folder, load_reference(model_folder), make_prompts(VOCAB))


def test_an_mqa_model_caches_one_kv_head_per_layer(tmp_path):
    loaded = load_model(_llama_mqa(tmp_path))
    assert kv_cache_layout(loaded.model).specs == (FullAttentionSpec(num_kv_heads=1, head_dim=16),) * 2


def test_a_falcon_model_caches_one_kv_head_per_layer(tmp_path):
    loaded = load_model(_falcon_mqa(tmp_path))
    assert kv_cache_layout(loaded.model).specs == (FullAttentionSpec(num_kv_heads=1, head_dim=16),) * 2
