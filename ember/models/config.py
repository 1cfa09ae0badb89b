"""ModelConfig: the architecture facts a model file needs, read from HF config.json or GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_HF_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency rescaling: "linear" (factor) or "llama3" (factor, low/high freq, original ctx)."""

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one decoder-only transformer of the Llama family."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    output_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token in float32 over all layers (2 * L * n_kv * d_h * 4)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 4

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """From a transformers `config.json` dict of a Llama, Mistral or Qwen2 model."""
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_HF_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported; ember loads {', '.join(SUPPORTED_HF_TYPES)}"
            )
        num_heads = config["num_attention_heads"]
        hidden = config["hidden_size"]
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            architecture=model_type,
            vocab_size=config["vocab_size"],
            hidden_size=hidden,
            intermediate_size=config["intermediate_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=config.get("head_dim") or hidden // num_heads,
            max_position_embeddings=config.get("max_position_embeddings", 4096),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=_hf_rope_theta(config),
            rope_scaling=_hf_rope_scaling(config),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            output_bias=attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
        )

    @classmethod
    def from_gguf(cls, metadata: dict[str, Any], has_output_tensor: bool) -> ModelConfig:
        """From GGUF key-value metadata (`{arch}.block_count` and friends)."""
        arch = metadata["general.architecture"]
        if arch not in ("llama", "qwen2", "mistral"):
            raise ValueError(f"GGUF architecture {arch!r} is not supported; ember loads llama and qwen2")

        def key(name: str, default: Any = None) -> Any:
            return metadata.get(f"{arch}.{name}", default)

        num_heads = key("attention.head_count")
        hidden = key("embedding_length")
        head_dim = key("attention.key_length") or key("rope.dimension_count") or hidden // num_heads
        vocab = key("vocab_size") or len(metadata["tokenizer.ggml.tokens"])
        scaling = None
        if key("rope.scaling.type") == "linear":
            scaling = RopeScaling(kind="linear", factor=float(key("rope.scaling.factor", 1.0)))
        return cls(
            architecture="qwen2" if arch == "qwen2" else "llama",
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=key("feed_forward_length"),
            num_layers=key("block_count"),
            num_heads=num_heads,
            num_kv_heads=key("attention.head_count_kv") or num_heads,
            head_dim=head_dim,
            max_position_embeddings=key("context_length", 4096),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            tie_word_embeddings=not has_output_tensor,
            qkv_bias=arch == "qwen2",
        )


def _hf_rope_theta(config: dict[str, Any]) -> float:
    if "rope_theta" in config:
        return float(config["rope_theta"])
    parameters = config.get("rope_parameters") or {}
    return float(parameters.get("rope_theta", 10000.0))


def _hf_rope_scaling(config: dict[str, Any]) -> RopeScaling | None:
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
    raise ValueError(f"rope scaling {kind!r} is not supported; ember handles linear and llama3")
