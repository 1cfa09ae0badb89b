"""StarCoder2 (BigCode's code models, bigcode/starcoder2-3b, -7b and -15b).

A pre-norm decoder with LayerNorm (weight and bias, `norm_epsilon`) where Llama has RMSNorm, and a plain MLP,
c_proj(act(c_fc(x))) with GELU (tanh form) where Llama has a gated one. Attention is grouped-query with rotary
positions over whole heads, as Llama's; `use_bias` puts biases on q/k/v/o and on both MLP projections at once.
A `sliding_window` windows every layer (as Mistral's does). The LM head is tied to the token embedding unless the
config says otherwise (starcoder2-15b keeps its own). Parameter names follow transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.activation import activation
from ember.layers.attention import AttentionMetadata
from ember.layers.linear import Linear
from ember.layers.rotary import RotaryEmbedding
from ember.models.config_reading import gguf_layer_norms, hf_rope_scaling, tensor_biases
from ember.models.decoder import DecoderForCausalLM
from ember.models.family_spec import FamilySpec, GGUFReading
from ember.models.llama import LlamaAttention


class Starcoder2MLP(nn.Module):
    """c_proj(act(c_fc(x))), act the config's hidden_act (gelu_pytorch_tanh in every released checkpoint)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.c_fc = Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.c_proj = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.activation = activation(config.hidden_act, "StarCoder2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.activation(self.c_fc(x)))


class Starcoder2DecoderLayer(nn.Module):
    """Pre-LayerNorm block: h = x + attn(ln1(x)); out = h + mlp(ln2(h))."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = LlamaAttention(config, rotary)  # GQA with rotary, q/k/v fused at load, biases per config
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = Starcoder2MLP(config)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), positions, kv_cache, metadata)
        return h + self.mlp(self.post_attention_layernorm(h))


class Starcoder2ForCausalLM(DecoderForCausalLM):
    """StarCoder2 on the shared decoder (each layer handed its window group's metadata), ending in a LayerNorm; the head
    tied to the embedding when the config ties them."""

    tied_weights = {"lm_head.weight": "model.embed_tokens.weight"}

    def make_layer(self, layer_index: int, rotary: RotaryEmbedding) -> nn.Module:
        return Starcoder2DecoderLayer(self.config, rotary)

    def make_final_norm(self) -> nn.Module:
        return nn.LayerNorm(self.config.hidden_size, eps=self.config.layer_norm_eps)


def _read_hf(config: dict[str, Any]) -> ModelConfig:
    """StarCoder2: GQA with rotary (`rope_parameters`, or `rope_theta` as the released configs write it), LayerNorm
    (`norm_epsilon`), biases everywhere or nowhere (`use_bias`), a `sliding_window` on every layer; missing keys take
    Starcoder2Config's defaults."""
    hidden = config.get("hidden_size", 3072)
    num_heads = config.get("num_attention_heads", 24)
    num_layers = config.get("num_hidden_layers", 30)
    bias = bool(config.get("use_bias", True))
    window = config.get("sliding_window")
    rope = config.get("rope_parameters") or {}
    return ModelConfig(
        architecture="starcoder2",
        vocab_size=config.get("vocab_size", 49152),
        hidden_size=hidden,
        intermediate_size=config.get("intermediate_size", 12288),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads", 2),
        head_dim=config.get("head_dim") or hidden // num_heads,
        max_position_embeddings=config.get("max_position_embeddings", 4096),
        rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or 10_000.0),  # the dict's wins, as in transformers
        rope_scaling=hf_rope_scaling(config),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        output_bias=bias,
        mlp_bias=bias,
        layer_windows=(int(window),) * num_layers if window else None,
        hidden_act=config.get("hidden_act", "gelu_pytorch_tanh"),
        layer_norm_eps=config.get("norm_epsilon", 1e-5),
    )


FAMILIES = (
    FamilySpec("starcoder2", Starcoder2ForCausalLM, _read_hf,
               gguf=GGUFReading(("starcoder2",), read_fields=lambda key: gguf_layer_norms(key, "gelu_pytorch_tanh"),
                                from_tensors=tensor_biases, layer_names={"ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"})),
)
