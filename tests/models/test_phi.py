"""Phi (phi-1 / phi-1.5 / phi-2: parallel block over one LayerNorm, partial rotary, biases, the head's included)
against transformers' PhiForCausalLM: prompt logits within family_parity.LOGIT_TOLERANCE and greedy tokens equal."""

from __future__ import annotations

import json

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


def _phi(**overrides) -> transformers.PhiConfig:
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=256, bos_token_id=1, eos_token_id=None)  # fmt: skip
    return transformers.PhiConfig(**{**settings, **overrides})


@pytest.mark.parametrize(
    "overrides",
    [{}, {"qk_layernorm": True}, {"num_key_value_heads": 2, "partial_rotary_factor": 0.25},
     {"tie_word_embeddings": True, "partial_rotary_factor": 1.0},
     {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0, "partial_rotary_factor": 0.5}}],
    ids=["phi-2-like-half-rotary", "qk-layernorm", "grouped-query-quarter-rotary", "tied-full-rotary", "linear-rope-scaling"],
)  # fmt: skip
def test_prompt_logits_and_greedy_generation_match_transformers(tmp_path, overrides):
    assert_random_model_matches(transformers.PhiForCausalLM, _phi(**overrides), tmp_path, VOCAB)


def test_a_phi_2_config_as_the_hub_writes_it_reads_its_top_level_rotary_keys():
    """microsoft/phi-2's config.json (transformers 4 layout): partial_rotary_factor 0.4 of an 80-wide head rotates 32."""
    hub = {"model_type": "phi", "vocab_size": 51200, "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": None, "partial_rotary_factor": 0.4, "rope_theta": 10000.0,
           "rope_scaling": None, "qk_layernorm": False, "hidden_act": "gelu_new", "tie_word_embeddings": False}  # fmt: skip
    config = config_from_hf(hub)
    assert (config.head_dim, config.rotary_dim, config.num_kv_heads, config.rope_scaling) == (80, 32, 32, None)


@pytest.mark.parametrize("rope_type", ["dynamic", "yarn"])
def test_a_rope_scaling_ember_cannot_run_is_refused_by_name(tmp_path, rope_type):
    config = json.loads(_phi(rope_parameters={"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0}).to_json_string())
    with pytest.raises(ValueError, match=rope_type):
        config_from_hf(config)


def test_a_rotary_fraction_that_leaves_an_odd_number_of_dims_is_refused():
    config = json.loads(_phi().to_json_string())
    config["rope_parameters"]["partial_rotary_factor"] = 0.1875  # 3 of a 16-wide head: no half-split pairs
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        config_from_hf(config)
