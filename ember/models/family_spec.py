"""What a model family declares about itself: `FamilySpec` (and `GGUFReading`, how it reads llama.cpp's files).

Each family file declares the specs of the architectures it runs; ember.models.family_registry collects them, and
everything else (config reading, the loader, quantize, tensor parallel) asks the registry instead of keeping a list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ember.config.model import ModelConfig

if TYPE_CHECKING:
    from ember.models.causal_lm import CausalLM

# A GGUF metadata key of the file's architecture ("block_count" -> "{arch}.block_count"), with a default.
GGUFKey = Callable[..., Any]
# The quantized checkpoint formats `ember quantize` writes back (an HF folder's, a GGUF file's).
QUANTIZE_FORMATS = ("safetensors", "gguf")


def _no_fields(key: GGUFKey) -> dict[str, Any]:
    return {}


def _as_read(config: ModelConfig, tensor_names: frozenset[str]) -> ModelConfig:
    return config


@dataclass(frozen=True)
class GGUFReading:
    """How a family reads llama.cpp's GGUF files: which `general.architecture` values it takes, its own config fields
    over the shared reading, and how its tensors are named and stored."""

    architectures: tuple[str, ...]
    # Files of these architectures with routed experts (`expert_count`) are this family's: a Llama file with experts
    # is Mixtral. A family without experts takes the files without them (or, failing that, every file of its names).
    has_experts: bool = False
    # The family's own fields read from the metadata (`key`), over the shared reading (ember.models.config_reading).
    read_fields: Callable[[GGUFKey], dict[str, Any]] = _no_fields
    # The config completed from the file's tensor names (biases llama.cpp adds only where a tensor is there).
    from_tensors: Callable[[ModelConfig, frozenset[str]], ModelConfig] = _as_read
    rotates_part_of_head: bool = False  # rope.dimension_count is what rotates (Phi-4-mini: 3/4 of each head)
    layer_names: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # llama.cpp part -> ours
    # A layer's experts: (module path, {llama.cpp's gate/up/down: our name}); None: Qwen-MoE's `mlp.experts`.
    expert_names: tuple[str, Mapping[str, str]] | None = None
    is_rope_interleaved: bool = False  # llama.cpp's converter reorders the q/k rows (interleaved rotary pairs)
    has_unit_offset_norms: bool = False  # norms stored as 1 + weight (Gemma's); ember's norms hold transformers' weight


@dataclass(frozen=True)
class FamilySpec:
    """One architecture ember runs (transformers' `model_type`, also `ModelConfig.architecture`): how its config is
    read, which model class runs it, and what ember can do with it beyond running it."""

    architecture: str
    model_class: type[CausalLM]
    read_hf: Callable[[dict[str, Any]], ModelConfig]  # a transformers config.json dict -> ModelConfig
    other_hf_types: tuple[str, ...] = ()  # more model_types `read_hf` takes (an image-text Gemma 3 checkpoint's)
    gguf: GGUFReading | None = None
    is_tensor_parallel: bool = False  # ember.parallel.sharding can split its layers across ranks
    quantize_formats: tuple[str, ...] = ()  # the checkpoint formats `ember quantize` writes back (QUANTIZE_FORMATS)

    def __post_init__(self) -> None:
        unknown = set(self.quantize_formats) - set(QUANTIZE_FORMATS)
        if unknown:
            raise ValueError(f"{self.architecture}: unknown quantize formats {sorted(unknown)}; known: {QUANTIZE_FORMATS}")

    @property
    def hf_model_types(self) -> tuple[str, ...]:
        """Every transformers `model_type` this family reads."""
        return (self.architecture, *self.other_hf_types)
