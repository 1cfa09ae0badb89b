"""Mixtral: Mistral's attention, and a sparse MoE feed-forward (top-2 of 8 experts) in every block."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.config.model import ModelConfig, MoEConfig
from ember.layers.attention import AttentionMetadata
from ember.layers.moe import MixtralExpert, SparseMoE
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.models.config_reading import HFDefaults, gguf_experts, llama_like_reader, no_biases
from ember.models.decoder import DecoderForCausalLM
from ember.models.family_spec import FamilySpec, GGUFReading
from ember.models.llama import LlamaAttention


class MixtralDecoderLayer(nn.Module):
    """h = x + attn(norm(x)); out = h + moe(norm(h))."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        if config.moe is None:
            raise ValueError("a Mixtral config needs num_local_experts and num_experts_per_tok")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.block_sparse_moe = SparseMoE(config.hidden_size, config.moe, MixtralExpert)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), positions, kv_cache, metadata)
        normed, h = self.post_attention_layernorm.add_and_norm(x, attended)
        return h + self.block_sparse_moe(normed)


class MixtralForCausalLM(DecoderForCausalLM):
    """Mixtral 8x7B-shaped model (any expert count and top-k)."""

    def make_layer(self, layer_index: int, rotary: RotaryEmbedding) -> nn.Module:
        return MixtralDecoderLayer(self.config, rotary)


def _experts(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "moe": MoEConfig(
            num_experts=config["num_local_experts"],
            num_experts_per_token=config["num_experts_per_tok"],
            expert_intermediate_size=config["intermediate_size"],
            normalize_top_k=True,
        )
    }


# A "llama" GGUF with routed experts is Mixtral (llama.cpp's converter writes it so).
FAMILIES = (
    FamilySpec("mixtral", MixtralForCausalLM,
               llama_like_reader(HFDefaults(biases=no_biases, rms_norm_eps=1e-5, ignores_layer_types=True), _experts),
               gguf=GGUFReading(("llama",), has_experts=True, read_fields=gguf_experts, is_rope_interleaved=True,
                                layer_names={"ffn_gate_inp": "block_sparse_moe.gate"},
                                expert_names=("block_sparse_moe.experts", {"gate": "w1", "up": "w3", "down": "w2"})),
               quantize_formats=("safetensors",)),
)
