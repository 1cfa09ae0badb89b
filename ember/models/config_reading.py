"""A checkpoint's configuration -> `ModelConfig` (ember.config.model): the reading families share.

Each family's own reader lives in its family file and builds on these (a Llama-like config.json with the family's
`HFDefaults`, a GGUF file's shared keys under its `GGUFReading`); ember.models.family_registry picks the reader.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ember.config.model import ModelConfig, MoEConfig, RopeScaling
from ember.models.family_spec import GGUFKey, GGUFReading

LayerTypes = Callable[[dict[str, Any], int], list[str]]  # (config.json, number of layers) -> each layer's attention kind


def attention_biases(config: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(q/k/v, o_proj, MLP) biases as most transformers classes read them: `attention_bias` for both projections,
    none in the MLP."""
    attention = bool(config.get("attention_bias", False))
    return attention, attention, False


def attention_and_mlp_biases(config: dict[str, Any]) -> tuple[bool, bool, bool]:
    """`attention_bias` for the attention's projections and `mlp_bias` for the MLP's (Llama's, Granite's, SmolLM3's)."""
    attention = bool(config.get("attention_bias", False))
    return attention, attention, bool(config.get("mlp_bias", False))


def no_biases(config: dict[str, Any]) -> tuple[bool, bool, bool]:
    """No bias anywhere, whatever the config says (Mistral, Mixtral, Phi-3)."""
    return False, False, False


def every_layer_slides(config: dict[str, Any], num_layers: int) -> list[str]:
    """Every layer attends within the window."""
    return ["sliding_attention"] * num_layers


@dataclass(frozen=True)
class HFDefaults:
    """How a Llama-like family's transformers class reads its config.json: what it assumes where a key is left out
    (save_pretrained leaves out a key that equals the family's default) and the keys it reads its own way."""

    biases: Callable[[dict[str, Any]], tuple[bool, bool, bool]] = attention_biases
    rms_norm_eps: float = 1e-6
    is_tied: bool = False
    reads_rope_scaling: bool = True  # False: the family reads it itself (DeepSeek-V2's YaRN, into its latent attention)
    windows_need_flag: bool = False  # windows apply only with `use_sliding_window` (Qwen's, SmolLM3's)
    ignores_layer_types: bool = False  # `default_layer_types` decide whatever `layer_types` says
    default_layer_types: LayerTypes = field(default=every_layer_slides)  # where a config names no `layer_types`


def llama_like_config(config: dict[str, Any], defaults: HFDefaults) -> ModelConfig:
    """A Llama-like family's config.json under transformers' standard names, read with the family's `defaults`."""
    model_type = config["model_type"]
    num_heads = config["num_attention_heads"]
    hidden = config["hidden_size"]
    qkv_bias, output_bias, mlp_bias = defaults.biases(config)
    return ModelConfig(
        architecture=model_type,
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,
        head_dim=config.get("head_dim") or hidden // num_heads,
        max_position_embeddings=config.get("max_position_embeddings", 4096),
        rms_norm_eps=config.get("rms_norm_eps", defaults.rms_norm_eps),
        rope_theta=hf_rope_theta(config),
        rope_scaling=hf_rope_scaling(config) if defaults.reads_rope_scaling else None,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", defaults.is_tied)),
        qkv_bias=qkv_bias,
        output_bias=output_bias,
        mlp_bias=mlp_bias,
        layer_windows=hf_layer_windows(config, defaults),
        hidden_act=config.get("hidden_act") or config.get("hidden_activation") or "silu",
    )


def llama_like_reader(
    defaults: HFDefaults, extras: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> Callable[[dict[str, Any]], ModelConfig]:
    """A family's config.json reader: the Llama-like reading under its `defaults`, then its own fields (`extras`)."""

    def read(config: dict[str, Any]) -> ModelConfig:
        base = llama_like_config(config, defaults)
        return base if extras is None else replace(base, **extras(config))

    return read


def hf_layer_windows(config: dict[str, Any], defaults: HFDefaults) -> tuple[int | None, ...] | None:
    """Per-layer windows from `sliding_window` and `layer_types` (else the family's transformers rule for them)."""
    window = config.get("sliding_window")
    num_layers = config["num_hidden_layers"]
    if defaults.windows_need_flag and not config.get("use_sliding_window", False):
        window = None
    if not window:
        return None
    layer_types = config.get("layer_types")
    if layer_types is None or defaults.ignores_layer_types:
        layer_types = defaults.default_layer_types(config, num_layers)
    windows = tuple(int(window) if kind == "sliding_attention" else None for kind in layer_types)
    return windows if any(w is not None for w in windows) else None


def hf_rope_theta(config: dict[str, Any]) -> float:
    """The rotary base: `rope_theta`, or inside `rope_parameters` (transformers 5), else 10,000."""
    if "rope_theta" in config:
        return float(config["rope_theta"])
    parameters = config.get("rope_parameters") or {}
    return float(parameters.get("rope_theta", 10000.0))


def hf_rope_scaling(config: dict[str, Any]) -> RopeScaling | None:
    """`rope_scaling` (or `rope_parameters`) as ember computes it; a kind it cannot compute is refused by name."""
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or None
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind == "linear":
        return RopeScaling(kind="linear", factor=float(scaling["factor"]))
    if kind == "llama3":
        return RopeScaling(
            kind="llama3",
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    if kind == "longrope":
        return _longrope_scaling(config, scaling)
    raise ValueError(f"rope scaling {kind!r} is not supported; ember handles linear, llama3 and longrope")


def _longrope_scaling(config: dict[str, Any], scaling: dict[str, Any]) -> RopeScaling:
    """Phi-3's LongRoPE; the attention factor, unless given, as its authors set it from the context's growth."""
    original = int(scaling.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
                   or config["max_position_embeddings"])
    factor = float(scaling.get("factor") or config["max_position_embeddings"] / original)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling(kind="longrope", original_max_position_embeddings=original, attention_factor=float(attention_factor),
                       frequency_factors=tuple(map(float, scaling["short_factor"])),
                       long_frequency_factors=tuple(map(float, scaling["long_factor"])))


def partial_rotary_decoder(config: dict[str, Any], parameters: dict[str, Any], partial: float, partial_key: str,
                            theta: float, max_positions: int, head_dim: int | None = None) -> dict[str, Any]:
    """The ModelConfig fields a LayerNorm decoder with partial rotary reads under transformers' standard names (GPT-NeoX,
    Phi, StableLM): shape, rotation (`parameters`: its rope dict), tying and LayerNorm eps."""
    num_heads = config["num_attention_heads"]
    head_dim = head_dim or config.get("head_dim") or config["hidden_size"] // num_heads
    return {
        "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"],
        "intermediate_size": config["intermediate_size"],
        "num_layers": config["num_hidden_layers"],
        "num_heads": num_heads,
        "num_kv_heads": config.get("num_key_value_heads") or num_heads,
        "head_dim": head_dim,
        "max_position_embeddings": config.get("max_position_embeddings", max_positions),
        "rope_theta": theta,
        "rope_scaling": hf_rope_scaling({**config, "rope_scaling": parameters}),
        "rotary_dim": rotary_dim(head_dim, partial, partial_key),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "layer_norm_eps": config.get("layer_norm_eps", 1e-5),
    }


def rotary_dim(head_dim: int, partial: float, key: str) -> int | None:
    """The leading dims of each head that rotate (None: all of them); ValueError naming `key` unless an even count."""
    rotary_dim = int(head_dim * partial)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(f"{key} {partial} rotates {rotary_dim} of {head_dim} dims: an even number is needed")
    return rotary_dim if rotary_dim < head_dim else None


def first_given(*values: Any) -> Any:
    """The first value that is not None (a config key set to 0 or 0.0 still counts as given)."""
    return next(value for value in values if value is not None)


def gguf_config(metadata: dict[str, Any], has_output_tensor: bool, architecture: str, reading: GGUFReading) -> ModelConfig:
    """A GGUF file's config (`{arch}.block_count` and friends) for a model of `architecture`: the keys every family
    shares, then the family's own (`reading.read_fields`)."""
    arch = metadata["general.architecture"]

    def key(name: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.{name}", default)

    num_heads = key("attention.head_count")
    hidden = key("embedding_length")
    rotated = key("rope.dimension_count")
    partial = reading.rotates_part_of_head  # rope.dimension_count is what rotates; elsewhere it is the head
    head_dim = key("attention.key_length") or (None if partial else rotated) or hidden // num_heads
    scaling = None
    if key("rope.scaling.type") == "linear":
        scaling = RopeScaling(kind="linear", factor=float(key("rope.scaling.factor", 1.0)))
    fields = {
        "architecture": architecture,
        "vocab_size": key("vocab_size") or len(metadata["tokenizer.ggml.tokens"]),
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_layers": key("block_count"),
        "num_heads": num_heads,
        "num_kv_heads": key("attention.head_count_kv") or num_heads,
        "head_dim": head_dim,
        "rotary_dim": rotated if partial and rotated and rotated < head_dim else None,
        "max_position_embeddings": key("context_length", 4096),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "rope_scaling": scaling,
        "tie_word_embeddings": not has_output_tensor,
    }
    return ModelConfig(**{**fields, **reading.read_fields(key)})


def gguf_experts(key: GGUFKey, has_shared_expert: bool = False) -> dict[str, Any]:
    """A GGUF's routed experts as llama.cpp runs them: softmax routing, the top-k weights renormalized unless the file
    says otherwise (Qwen2-MoE's default: not), a shared expert gated by a sigmoid where the family has one. Every layer
    is sparse here (the loader marks the layers whose file holds a plain MLP instead, `dense_layers`)."""
    shared = key("expert_shared_feed_forward_length", 0) if has_shared_expert else 0
    if key("expert_gating_func", 1) != 1:  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
        raise ValueError(f"this GGUF routes its experts with gating function {key('expert_gating_func')}; "
                         "ember routes GGUF experts with a softmax only")
    moe = MoEConfig(
        num_experts=key("expert_count"),
        num_experts_per_token=key("expert_used_count"),
        expert_intermediate_size=key("expert_feed_forward_length") or key("feed_forward_length"),
        normalize_top_k=bool(key("expert_weights_norm", not has_shared_expert)),
        shared_intermediate_size=shared,
        has_shared_expert_gate=shared > 0,
    )
    return {"moe": moe}


def gguf_layer_norms(key: GGUFKey, activation: str) -> dict[str, Any]:
    """A LayerNorm family's GGUF fields (StarCoder2, Phi-2, StableLM): its eps and activation (biases and residual are
    read from the tensors: `tensor_biases`)."""
    return {"layer_norm_eps": float(key("attention.layer_norm_epsilon", 1e-5)), "hidden_act": activation}


def tensor_biases(config: ModelConfig, tensor_names: frozenset[str]) -> ModelConfig:
    """A config with the biases its file holds (llama.cpp adds each only where the tensor is there)."""
    return replace(config, qkv_bias="blk.0.attn_q.bias" in tensor_names, output_bias="blk.0.attn_output.bias" in tensor_names,
                   mlp_bias="blk.0.ffn_up.bias" in tensor_names)
