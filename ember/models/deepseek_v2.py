"""DeepSeek-V2: multi-head latent attention (a compressed KV cache) and MoE with shared experts."""

from __future__ import annotations

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.kv.specs import KVCacheSpec, kv_specs_for
from ember.layers.attention import AttentionMetadata
from ember.layers.mla import InterleavedRotaryEmbedding, LatentAttention
from ember.layers.moe import GatedMLP, SparseMoE
from ember.layers.norm import RMSNorm
from ember.models.decoder import DecoderForCausalLM


class DeepseekV2DecoderLayer(nn.Module):
    """h = x + mla(norm(x)); out = h + mlp(norm(h)), mlp sparse (routed + shared) except in dense layers."""

    def __init__(self, config: ModelConfig, rotary: InterleavedRotaryEmbedding, layer_index: int) -> None:
        super().__init__()
        if config.moe is None:
            raise ValueError("a DeepSeek-V2 config needs n_routed_experts and num_experts_per_tok")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LatentAttention(config, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module
        if layer_index in config.moe.dense_layers:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        else:
            self.mlp = SparseMoE(config.hidden_size, config.moe, GatedMLP, shared_name="shared_experts")

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), positions, kv_cache, metadata)
        normed, h = self.post_attention_layernorm.add_and_norm(x, attended)
        return h + self.mlp(normed)


class DeepseekV2ForCausalLM(DecoderForCausalLM):
    """DeepSeek-V2(-Lite)-shaped model; its cache holds latents, not keys and values."""

    def make_layer(self, layer_index: int, rotary: InterleavedRotaryEmbedding) -> nn.Module:
        return DeepseekV2DecoderLayer(self.config, rotary, layer_index)

    def make_rotary(self) -> InterleavedRotaryEmbedding:
        config = self.config
        assert config.mla is not None
        mla = config.mla
        return InterleavedRotaryEmbedding(mla.qk_rope_head_dim, config.rotary_table_positions, config.rope_theta, mla.yarn)

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        if self.config.mla is None:
            raise ValueError("a DeepSeek-V2 config needs kv_lora_rank and qk_rope_head_dim")
        return kv_specs_for(self.config)  # latent: c_kv and the rope key per token and layer
