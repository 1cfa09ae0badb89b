"""Every registered family keeps the `CausalLM` contract: built from a tiny transformers checkpoint of its model_type
and loaded by ember, it answers every question the loader, the runner, quantize and draft heads ask of it."""

from __future__ import annotations

import pytest
import torch

from ember.models.causal_lm import CausalLM
from ember.models.family_registry import family_specs
from ember.models.family_spec import FamilySpec
from ember.models.loader import load_model
from tests.models.family_parity import ember_prompt_logits, save_random_model, single_thread_torch  # noqa: F401 (a fixture)

TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# What a family needs beyond TINY to be tiny (transformers' defaults are full-size) or to show its structure.
FAMILY_SETTINGS = {
    "gpt2": dict(n_inner=128),
    "opt": dict(ffn_dim=128, word_embed_proj_dim=64),
    "gemma": dict(head_dim=16),
    "gemma2": dict(head_dim=16, sliding_window=8),
    "gemma3_text": dict(head_dim=16, sliding_window=8),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "deepseek_v2": dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=None,
                        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
    "smollm3": dict(no_rope_layers=[1, 0]),
    "phi3": dict(sliding_window=None),
}


def _tiny_checkpoint(spec: FamilySpec, folder):
    import transformers

    config = transformers.AutoConfig.for_model(spec.architecture, **{**TINY, **FAMILY_SETTINGS.get(spec.architecture, {})})
    return save_random_model(transformers.AutoModelForCausalLM.from_config, config, folder)


@pytest.mark.usefixtures("single_thread_torch")
@pytest.mark.parametrize("spec", family_specs(), ids=lambda spec: spec.architecture)
def test_every_registered_family_keeps_the_causal_lm_contract(spec, tmp_path):
    folder = _tiny_checkpoint(spec, tmp_path / spec.architecture)
    loaded = load_model(folder, "float32")
    model, config = loaded.model, loaded.config
    assert config.architecture == spec.architecture and type(model) is spec.model_class and isinstance(model, CausalLM)

    assert len(model.kv_cache_specs()) == config.num_layers
    modules = set(model.modules())
    embedding = model.input_embedding()
    assert embedding in modules
    assert embedding(torch.tensor([1, 2])).shape == (2, config.embedding_width)
    norms = model.input_norms()
    assert norms is None or (len(norms) == config.num_layers and {norm for pair in norms for norm in pair} <= modules)
    names = set(model.state_dict())
    assert set(model.tied_weights) | set(model.tied_weights.values()) <= names
    assert all(any(name.startswith(ours) for name in names) for ours in model.checkpoint_prefixes.values())

    (logits,) = ember_prompt_logits(folder, [[3, 5, 7, 11]])
    assert logits.shape == (4, config.vocab_size) and torch.isfinite(logits).all()
