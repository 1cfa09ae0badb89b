"""Qwen2-MoE and Qwen3-MoE: Qwen attention (QKV bias in Qwen2, per-head query and key norms in Qwen3), routed
experts, plus in Qwen2-MoE one sigmoid-gated shared expert."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.config.model import ModelConfig, MoEConfig
from ember.layers.attention import AttentionMetadata
from ember.layers.moe import GatedMLP, SparseMoE
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.models.config_reading import (
    HFDefaults,
    attention_biases,
    gguf_experts,
    llama_like_reader,
)
from ember.models.decoder import DecoderForCausalLM
from ember.models.family_spec import FamilySpec, GGUFKey, GGUFReading
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


def _qwen2_moe_biases(config: dict[str, Any]) -> tuple[bool, bool, bool]:
    """Qwen2-MoE's q/k/v biases (`qkv_bias`, on unless it says otherwise), no others."""
    return bool(config.get("qkv_bias", True)), False, False


def _every_other_below_max_window_layers(config: dict[str, Any], num_layers: int) -> list[str]:
    """Qwen2-MoE's rule: every other layer slides, below `max_window_layers`."""
    last = config.get("max_window_layers", num_layers)
    return ["sliding_attention" if i % 2 == 0 and i < last else "full_attention" for i in range(num_layers)]


def _experts(config: dict[str, Any]) -> dict[str, Any]:
    """Qwen2-MoE and Qwen3-MoE: sparse every `decoder_sparse_step`-th layer except `mlp_only_layers`; Qwen2-MoE adds a
    sigmoid-gated shared expert, Qwen3-MoE has none and normalizes queries and keys per head."""
    num_layers = config["num_hidden_layers"]
    step = config.get("decoder_sparse_step", 1)
    only_mlp = set(config.get("mlp_only_layers") or [])
    num_experts = config["num_experts"] if "num_experts" in config else config["num_local_experts"]  # hub or transformers 5
    dense = tuple(i for i in range(num_layers) if i in only_mlp or num_experts == 0 or (i + 1) % step)
    shared = config.get("shared_expert_intermediate_size", 0)
    return {
        "moe": MoEConfig(
            num_experts=num_experts,
            num_experts_per_token=config["num_experts_per_tok"],
            expert_intermediate_size=config["moe_intermediate_size"],
            normalize_top_k=bool(config.get("norm_topk_prob", False)),
            shared_intermediate_size=shared,
            has_shared_expert_gate=shared > 0,
            dense_layers=dense,
        ),
        "qk_norm": config["model_type"] == "qwen3_moe",
    }


def _gguf_qwen2_moe(key: GGUFKey) -> dict[str, Any]:
    return {**gguf_experts(key, has_shared_expert=True), "qkv_bias": True}


def _gguf_qwen3_moe(key: GGUFKey) -> dict[str, Any]:
    return {**gguf_experts(key), "qk_norm": True}


# The router, Qwen2-MoE's shared expert and its gate (one weight per hidden unit), as llama.cpp names them.
_GGUF_LAYER_NAMES = {"ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
                     "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
                     "ffn_down_shexp": "mlp.shared_expert.down_proj"}
FAMILIES = (
    FamilySpec("qwen2_moe", Qwen2MoeForCausalLM,
               llama_like_reader(HFDefaults(biases=_qwen2_moe_biases, windows_need_flag=True,
                                            default_layer_types=_every_other_below_max_window_layers), _experts),
               gguf=GGUFReading(("qwen2moe",), has_experts=True, read_fields=_gguf_qwen2_moe, layer_names=_GGUF_LAYER_NAMES),
               quantize_formats=("safetensors",)),
    FamilySpec("qwen3_moe", Qwen2MoeForCausalLM,  # every layer slides, whatever layer_types says
               llama_like_reader(HFDefaults(biases=attention_biases, windows_need_flag=True, ignores_layer_types=True),
                                 _experts),
               gguf=GGUFReading(("qwen3moe",), has_experts=True, read_fields=_gguf_qwen3_moe, layer_names=_GGUF_LAYER_NAMES),
               quantize_formats=("safetensors",)),
)
