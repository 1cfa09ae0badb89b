"""Tiny random MoE checkpoints for the parallel tests (transformers' own classes, saved as safetensors)."""

from __future__ import annotations

from pathlib import Path

import transformers

from tests.models.family_parity import save_random_model

VOCAB = 256
TINY = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256)


def save_mixtral(folder: Path) -> Path:
    """Top-2 of 8 experts in both layers."""
    config = transformers.MixtralConfig(**TINY, num_key_value_heads=2, intermediate_size=64, num_local_experts=8, num_experts_per_tok=2)
    return save_random_model(transformers.MixtralForCausalLM, config, folder)


def save_qwen2_moe(folder: Path) -> Path:
    """Top-2 of 6 experts plus a gated shared expert; layer 0 is a dense MLP."""
    config = transformers.Qwen2MoeConfig(
        **TINY, num_key_value_heads=2, intermediate_size=96, num_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=False, mlp_only_layers=[0],
    )  # fmt: skip
    return save_random_model(transformers.Qwen2MoeForCausalLM, config, folder)


def save_qwen3_moe(folder: Path) -> Path:
    """Top-2 of 6 experts, normalized, no shared expert; per-head q/k norms, heads not hidden / num_heads wide; layer 1 dense."""
    config = transformers.Qwen3MoeConfig(
        **TINY, num_key_value_heads=2, head_dim=24, intermediate_size=96, num_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1],
    )  # fmt: skip
    return save_random_model(transformers.Qwen3MoeForCausalLM, config, folder)


def save_deepseek_v2(folder: Path) -> Path:
    """MLA attention, top-2 of 6 routed experts plus a shared one; layer 0 dense."""
    config = transformers.DeepseekV2Config(
        **TINY, num_key_value_heads=4, intermediate_size=96, n_routed_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=1.5,
        kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
    )  # fmt: skip
    return save_random_model(transformers.DeepseekV2ForCausalLM, config, folder)
