"""DeepSeek-V2: multi-head latent attention (a compressed KV cache) and MoE with shared experts."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.config.model import LatentAttentionConfig, ModelConfig, MoEConfig, YarnRope
from ember.kv.specs import KVCacheSpec, kv_specs_for
from ember.layers.attention import AttentionMetadata
from ember.layers.mla import InterleavedRotaryEmbedding, LatentAttention
from ember.layers.moe import GatedMLP, SparseMoE
from ember.layers.norm import RMSNorm
from ember.models.config_reading import HFDefaults, attention_biases, llama_like_reader
from ember.models.decoder import DecoderForCausalLM
from ember.models.family_spec import FamilySpec


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


def _latent_attention_and_experts(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("mlp_bias"):
        raise ValueError("DeepSeek-V2 with mlp_bias is not supported; ember's DeepSeek-V2 MLPs and experts have no biases")
    topk_method = config.get("topk_method", "greedy")
    if topk_method not in ("greedy", "group_limited_greedy"):
        raise ValueError(f"DeepSeek-V2 topk_method {topk_method!r} is not supported; ember routes greedy or group_limited_greedy")
    is_grouped = topk_method == "group_limited_greedy"
    yarn = _hf_yarn(config)
    first_moe = config.get("first_k_dense_replace", 0)
    moe_every = config.get("moe_layer_freq", 1)
    num_layers = config["num_hidden_layers"]
    dense = tuple(i for i in range(num_layers) if i < first_moe or i % moe_every)
    mla = LatentAttentionConfig(
        kv_lora_rank=config["kv_lora_rank"],
        qk_nope_head_dim=config["qk_nope_head_dim"],
        qk_rope_head_dim=config["qk_rope_head_dim"],
        v_head_dim=config["v_head_dim"],
        q_lora_rank=config.get("q_lora_rank"),
        yarn=yarn,
    )
    return {
        "head_dim": config["qk_nope_head_dim"] + config["qk_rope_head_dim"],
        "qkv_bias": bool(config.get("attention_bias", False)),
        "mla": mla,
        "moe": MoEConfig(
            num_experts=config["n_routed_experts"],
            num_experts_per_token=config["num_experts_per_tok"],
            expert_intermediate_size=config["moe_intermediate_size"],
            normalize_top_k=False,  # transformers' greedy router leaves the top-k weights as they are
            routed_scaling_factor=float(config.get("routed_scaling_factor", 1.0)),
            shared_intermediate_size=config["moe_intermediate_size"] * (config.get("n_shared_experts") or 0),
            dense_layers=dense,
            num_expert_groups=config.get("n_group") if is_grouped else None,
            num_selected_groups=config.get("topk_group") if is_grouped else None,
        ),
    }


def _hf_yarn(config: dict[str, Any]) -> YarnRope | None:
    """DeepSeek-V2's rope scaling: none, or YaRN (the only kind its checkpoints use)."""
    parameters = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = parameters.get("rope_type") or parameters.get("type") or "default"
    if kind == "default":
        return None
    if kind != "yarn":
        raise ValueError(f"DeepSeek-V2 rope scaling {kind!r} is not supported; ember runs default rope and YaRN")
    original = parameters.get("original_max_position_embeddings") or config["max_position_embeddings"]
    factor = parameters.get("factor") or config["max_position_embeddings"] / original
    return YarnRope(
        factor=float(factor),
        original_max_position_embeddings=int(original),
        beta_fast=float(parameters.get("beta_fast") or 32),
        beta_slow=float(parameters.get("beta_slow") or 1),
        mscale=parameters.get("mscale"),
        mscale_all_dim=parameters.get("mscale_all_dim"),
        attention_factor=parameters.get("attention_factor"),
        truncate=bool(parameters.get("truncate", True)),
    )


FAMILIES = (
    # its YaRN is read into the latent attention config, not as rope_scaling
    FamilySpec("deepseek_v2", DeepseekV2ForCausalLM,
               llama_like_reader(HFDefaults(biases=attention_biases, reads_rope_scaling=False), _latent_attention_and_experts),
               quantize_formats=("safetensors",)),
)
