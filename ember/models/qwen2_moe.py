"""Qwen2-MoE and Qwen3-MoE: Qwen attention (QKV bias in Qwen2, per-head query and key norms in Qwen3), routed
experts, plus in Qwen2-MoE one sigmoid-gated shared expert."""

from __future__ import annotations

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.attention import AttentionMetadata
from ember.layers.moe import GatedMLP, SparseMoE
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.models.decoder import DecoderForCausalLM
from ember.models.llama import LlamaAttention


class Qwen2MoeDecoderLayer(nn.Module):
    """h = x + attn(norm(x)); out = h + mlp(norm(h)), where mlp is sparse except in dense layers."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, layer_index: int) -> None:
        super().__init__()
        if config.moe is None:
            raise ValueError("a Qwen MoE config needs num_experts and num_experts_per_tok")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module
        if layer_index in config.moe.dense_layers:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        else:
            self.mlp = SparseMoE(config.hidden_size, config.moe, GatedMLP, shared_name="shared_expert")

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), positions, kv_cache, metadata)
        normed, h = self.post_attention_layernorm.add_and_norm(x, attended)
        return h + self.mlp(normed)


class Qwen2MoeForCausalLM(DecoderForCausalLM):
    """Qwen1.5-MoE / Qwen2-MoE / Qwen3-MoE-shaped model."""

    def make_layer(self, layer_index: int, rotary: RotaryEmbedding) -> nn.Module:
        return Qwen2MoeDecoderLayer(self.config, rotary, layer_index)
