"""StableLM (3B-4E1T: a quarter of each head rotated; StableLM-2: q/k/v biases, GQA, per-head q/k LayerNorms, parallel
residual) against transformers' StableLmForCausalLM: prompt logits within family_parity's LOGIT_TOLERANCE (1e-4, float32)
and greedy tokens equal."""

from __future__ import annotations

import json

import pytest
import transformers

from ember.models.family_registry import config_from_hf
from ember.models.loader import model_class
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

VOCAB = 304


def _stablelm(**overrides) -> transformers.StableLmConfig:
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, max_position_embeddings=256, bos_token_id=1, eos_token_id=None)  # fmt: skip
    return transformers.StableLmConfig(**{**settings, **overrides})


VARIANTS = {
    "stablelm-3b": {},  # partial_rotary_factor 0.25 by default, no q/k/v biases, multi-head
    "stablelm-2-qkv-bias-gqa": {"use_qkv_bias": True, "num_key_value_heads": 2, "rope_theta": 500.0},
    "qk-layernorm-gqa": {"qk_layernorm": True, "num_key_value_heads": 2, "partial_rotary_factor": 0.5},
    "parallel-residual-tied": {"use_parallel_residual": True, "qk_layernorm": True, "tie_word_embeddings": True},
}


@pytest.mark.parametrize("overrides", VARIANTS.values(), ids=VARIANTS.keys())
def test_prompt_logits_and_greedy_generation_match_transformers(tmp_path, overrides):
    assert_random_model_matches(transformers.StableLmForCausalLM, _stablelm(**overrides), tmp_path, VOCAB)


def test_a_hub_config_with_rotary_keys_beside_the_rest_loads_as_transformers_reads_it(tmp_path):
    """The hub's StableLM configs (transformers 4) write rope_theta and partial_rotary_factor at the top level."""
    folder = save_random_model(transformers.StableLmForCausalLM, _stablelm(partial_rotary_factor=0.5, rope_theta=500.0), tmp_path)
    reference = load_reference(folder)
    config = json.loads((folder / "config.json").read_text())
    del config["rope_parameters"]
    config.update(rope_theta=500.0, partial_rotary_factor=0.5, rope_scaling=None)
    (folder / "config.json").write_text(json.dumps(config))
    assert (config_from_hf(config).rotary_dim, config_from_hf(config).rope_theta) == (8, 500.0)
    assert_prompt_logits_match(folder, reference, make_prompts(VOCAB))


def _hub_config(**overrides) -> dict:
    config = dict(model_type="stablelm", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, rope_theta=10_000.0, partial_rotary_factor=0.25)  # fmt: skip
    return {**config, **overrides}


@pytest.mark.parametrize(("overrides", "named"), [
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
    ({"partial_rotary_factor": 0.1875}, "partial_rotary_factor 0.1875"),  # 3 of 16 dims
    ({"hidden_act": "mish"}, "'mish'"),
], ids=["dynamic-rope", "odd-rotary-dims", "unknown-activation"])  # fmt: skip
def test_options_ember_cannot_run_are_refused_by_name(overrides, named):
    with pytest.raises(ValueError, match=named):
        config = config_from_hf(_hub_config(**overrides))
        model_class(config)(config)
