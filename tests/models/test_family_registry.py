"""The family registry: each model_type and GGUF architecture has exactly one reader, and what none reads is refused
by name."""

from __future__ import annotations

from collections import Counter

import pytest

from ember.models.family_registry import config_from_hf, family_of, family_specs, gguf_family


def test_every_model_type_and_gguf_architecture_belongs_to_exactly_one_family():
    model_types = Counter(name for spec in family_specs() for name in spec.hf_model_types)
    gguf_kinds = Counter((name, spec.gguf.has_experts) for spec in family_specs() if spec.gguf is not None
                         for name in spec.gguf.architectures)
    assert [name for name, count in model_types.items() if count > 1] == []
    assert [kind for kind, count in gguf_kinds.items() if count > 1] == []
    assert [spec.architecture for spec in family_specs()] == list(dict.fromkeys(spec.architecture for spec in family_specs()))


def test_a_llama_gguf_reads_as_mixtral_with_experts_and_a_mistral_gguf_as_llama():
    assert gguf_family("llama", has_experts=True).architecture == "mixtral"
    assert gguf_family("llama", has_experts=False).architecture == "llama"
    assert gguf_family("mistral", has_experts=False).architecture == "llama"
    assert gguf_family("qwen2moe", has_experts=True).architecture == "qwen2_moe"


def test_what_no_family_reads_is_refused_naming_what_ember_reads():
    with pytest.raises(ValueError, match=r"model_type 'mamba' is not supported; ember loads llama, qwen2, "):
        config_from_hf({"model_type": "mamba"})
    with pytest.raises(ValueError, match=r"GGUF architecture 'rwkv6' is not supported; ember loads llama, mistral, "):
        gguf_family("rwkv6", has_experts=False)
    with pytest.raises(ValueError, match=r"architecture 'mamba' has no ember model; ember runs llama, qwen2, "):
        family_of("mamba")


def test_an_image_text_gemma3_config_reads_as_its_text_model():
    config = config_from_hf({"model_type": "gemma3", "text_config": {"num_hidden_layers": 2}})
    assert (config.architecture, config.num_layers, config.vocab_size) == ("gemma3_text", 2, 262_208)
