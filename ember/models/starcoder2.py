"""StarCoder2 (BigCode's code models, bigcode/starcoder2-3b, -7b and -15b).

A pre-norm decoder with LayerNorm (weight and bias, `norm_epsilon`) where Llama has RMSNorm, and a plain MLP,
c_proj(act(c_fc(x))) with GELU (tanh form) where Llama has a gated one. Attention is grouped-query with rotary
positions over whole heads, as Llama's; `use_bias` puts biases on q/k/v/o and on both MLP projections at once.
A `sliding_window` windows every layer (as Mistral's does). The LM head is tied to the token embedding unless the
config says otherwise (starcoder2-15b keeps its own). Parameter names follow transformers.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.activation import activation
from ember.layers.attention import AttentionMetadata
from ember.layers.linear import Linear
from ember.layers.rotary import RotaryEmbedding
from ember.models.decoder import DecoderForCausalLM
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
