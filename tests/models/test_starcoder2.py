"""StarCoder2 (LayerNorm, GQA with rotary and biases, GELU MLP, tied head, optional sliding window on every layer)
against transformers' Starcoder2ForCausalLM, within family_parity's LOGIT_TOLERANCE and token for token greedy."""

from __future__ import annotations

import pytest
import transformers

from ember.models.family_registry import config_from_hf
from tests.models.family_parity import (  # noqa: F401 (single_thread_torch is a fixture)
    assert_greedy_matches,
    assert_prompt_logits_match,
    assert_random_model_matches,
    load_reference,
    make_prompts,
    save_random_model,
    single_thread_torch,
)

pytestmark = pytest.mark.usefixtures("single_thread_torch")

VOCAB = 296
WINDOW = 8  # shorter than the 23- and 40-token prompts, so the window cuts into both prefill and decode


def _starcoder2(**overrides) -> transformers.Starcoder2Config:
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=None, initializer_range=0.1)  # fmt: skip
    return transformers.Starcoder2Config(**{**settings, **overrides})


@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_attention_heads": 8, "num_key_value_heads": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0}},
     {"use_bias": False, "tie_word_embeddings": False}],
    ids=["tied-biases", "gqa-4-to-1-rope-theta-100", "no-bias-untied"],
)
def test_prompt_logits_and_greedy_generation_match_transformers(tmp_path, overrides):
    assert_random_model_matches(transformers.Starcoder2ForCausalLM, _starcoder2(**overrides), tmp_path, VOCAB)


def test_a_sliding_window_on_every_layer_matches_transformers_past_the_window(tmp_path):
    llm = assert_random_model_matches(transformers.Starcoder2ForCausalLM, _starcoder2(sliding_window=WINDOW), tmp_path, VOCAB)
    assert llm.engine.kv.group_windows == (WINDOW,)


def test_the_config_reads_starcoder2s_own_keys_and_release_defaults():
    """A released config's keys (bigcode/starcoder2-3b's shape): norm_epsilon, use_bias, a top-level rope_theta,
    sliding_window on every layer; the head tied when the config is silent."""
    config = config_from_hf({
        "model_type": "starcoder2", "vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288,
        "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2, "norm_epsilon": 1e-5,
        "rope_theta": 999999.4420358813, "sliding_window": 4096, "use_bias": True, "hidden_act": "gelu_pytorch_tanh",
        "max_position_embeddings": 16384,
    })  # fmt: skip
    assert (config.num_kv_heads, config.head_dim, config.rope_theta) == (2, 128, 999999.4420358813)
    assert (config.qkv_bias, config.output_bias, config.mlp_bias, config.tie_word_embeddings) == (True, True, True, True)
    assert config.layer_windows == (4096,) * 30


def test_a_rope_type_ember_cannot_run_is_refused_by_name():
    config = _starcoder2(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}).to_dict()
    with pytest.raises(ValueError, match="'dynamic'"):
        config_from_hf(config)
