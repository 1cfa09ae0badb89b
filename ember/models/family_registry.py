"""The one list of model families: every family file's `FAMILIES`, and the questions the rest of ember asks of them.

Which family reads a config.json (`config_from_hf`) or a GGUF file (`config_from_gguf`), which class runs an
architecture (`family_of`), what ember can do with it (`FamilySpec`'s abilities). Adding a family is its file (its
model, its readers, its `FAMILIES`) and its line below.
"""

from __future__ import annotations

from typing import Any

from ember.config.model import ModelConfig
from ember.models import (
    deepseek_v2,
    falcon,
    gemma2,
    gpt2,
    gpt_neox,
    llama,
    mixtral,
    olmo2,
    opt,
    phi,
    qwen2_moe,
    stablelm,
    starcoder2,
)
from ember.models.config_reading import gguf_config
from ember.models.family_spec import FamilySpec

_FAMILY_MODULES = (llama, mixtral, qwen2_moe, deepseek_v2, olmo2, gemma2, gpt2, falcon, opt, gpt_neox, starcoder2, phi, stablelm)


def family_specs() -> tuple[FamilySpec, ...]:
    """Every architecture ember runs, in the order they are listed to a user."""
    return tuple(spec for module in _FAMILY_MODULES for spec in module.FAMILIES)


def family_of(architecture: str) -> FamilySpec:
    """The family that runs `architecture` (a `ModelConfig.architecture`); ValueError naming the ones ember runs."""
    specs = family_specs()
    spec = next((spec for spec in specs if spec.architecture == architecture), None)
    if spec is None:
        raise ValueError(f"architecture {architecture!r} has no ember model; ember runs "
                         f"{', '.join(spec.architecture for spec in specs)}")
    return spec


def config_from_hf(config: dict[str, Any]) -> ModelConfig:
    """A transformers `config.json` dict -> ModelConfig, read by the family that takes its `model_type`."""
    model_type = config.get("model_type")
    specs = family_specs()
    spec = next((spec for spec in specs if model_type in spec.hf_model_types), None)
    if spec is None:
        known = ", ".join(name for spec in specs for name in spec.hf_model_types)
        raise ValueError(f"model_type {model_type!r} is not supported; ember loads {known}")
    return spec.read_hf(config)


def gguf_family(architecture: str, has_experts: bool) -> FamilySpec:
    """The family that reads GGUF files of llama.cpp's `architecture` (`general.architecture`), with routed experts or
    without; ValueError naming the architectures ember reads."""
    specs = [spec for spec in family_specs() if spec.gguf is not None and architecture in spec.gguf.architectures]
    if not specs:
        known = ", ".join(name for spec in family_specs() if spec.gguf is not None for name in spec.gguf.architectures)
        raise ValueError(f"GGUF architecture {architecture!r} is not supported; ember loads {known}")
    return next((spec for spec in specs if spec.gguf.has_experts == has_experts), specs[0])


def config_from_gguf(metadata: dict[str, Any], tensor_names: frozenset[str]) -> ModelConfig:
    """A GGUF file's metadata (and its tensors' names, where they are the better source) -> ModelConfig, read by the
    family that takes its architecture."""
    architecture = metadata["general.architecture"]
    spec = gguf_family(architecture, has_experts=bool(metadata.get(f"{architecture}.expert_count")))
    reading = spec.gguf
    config = gguf_config(metadata, "output.weight" in tensor_names, spec.architecture, reading)
    return reading.from_tensors(config, tensor_names)


def quantizable_architectures() -> tuple[str, ...]:
    """The architectures whose checkpoints `ember quantize` writes back."""
    return tuple(spec.architecture for spec in family_specs() if spec.quantize_formats)

