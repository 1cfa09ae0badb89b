"""Falcon-7B-style multi-query attention: one KV head for all query heads, attention and MLP in parallel.

The block is `out = x + attn(ln(x)) + mlp(ln(x))` (`parallel_attn`), one LayerNorm per block,
GELU MLP, rotary positions, and a fused `query_key_value` projection laid out as
[query heads..., key, value] (`multi_query`) or per head [q, k, v] (plain MHA).
Falcon-40B's grouped layout (`new_decoder_architecture`) and ALiBi are not supported.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.config.model import ModelConfig
from ember.kv.specs import FullAttentionSpec, KVCacheSpec
from ember.layers.attention import AttentionMetadata, paged_attention
from ember.layers.linear import Linear
from ember.layers.rotary import RotaryEmbedding
from ember.models.causal_lm import CausalLM
from ember.models.config_reading import hf_rope_scaling, hf_rope_theta
from ember.models.family_spec import FamilySpec


class FalconAttention(nn.Module):
    """Multi-query (or multi-head) attention with rotary positions and a fused QKV projection."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.is_multi_query = config.num_kv_heads == 1
        qkv_size = (self.num_heads + 2) * self.head_dim if self.is_multi_query else 3 * config.hidden_size
        self.query_key_value = Linear(config.hidden_size, qkv_size, bias=config.qkv_bias)
        self.dense = Linear(config.hidden_size, config.hidden_size, bias=config.output_bias)
        self.scale = self.head_dim**-0.5
        self.rotary = rotary

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        fused = self.query_key_value(x)
        if self.is_multi_query:
            qkv = fused.view(num_tokens, self.num_heads + 2, self.head_dim)
            q, k, v = qkv[:, :-2], qkv[:, -2:-1], qkv[:, -1:]
        else:
            q, k, v = fused.view(num_tokens, self.num_heads, 3, self.head_dim).unbind(2)
        q, k = self.rotary(positions, q, k)
        out = paged_attention(q, k, v, kv_cache, metadata, self.scale)
        return self.dense(out.reshape(num_tokens, -1))


class FalconMLP(nn.Module):
    """dense_4h_to_h(gelu(dense_h_to_4h(x)))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.dense_4h_to_h = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class FalconDecoderLayer(nn.Module):
    """Parallel block: n = ln(x); out = x + attn(n) + mlp(n)."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attention = FalconAttention(config, rotary)
        self.mlp = FalconMLP(config)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        n = self.input_layernorm(x)
        return x + self.self_attention(n, positions, kv_cache, metadata) + self.mlp(n)


class FalconModel(nn.Module):
    """Embedding, the parallel blocks, the final LayerNorm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        rotary = RotaryEmbedding(config.head_dim, config.rotary_table_positions, config.rope_theta, config.rope_scaling)
        self.h = nn.ModuleList(FalconDecoderLayer(config, rotary) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = self.word_embeddings(input_ids)
        for layer, kv_cache in zip(self.h, kv_caches, strict=True):
            h = layer(h, positions, kv_cache, metadata)
        return self.ln_f(h)


class FalconForCausalLM(CausalLM):
    """Falcon with its LM head tied to the word embedding; names follow transformers."""

    tied_weights = {"lm_head.weight": "transformer.word_embeddings.weight"}

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = FalconModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        return [FullAttentionSpec(self.config.num_kv_heads, self.config.head_dim)] * self.config.num_layers

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Final hidden states [num_tokens, hidden] of the flat batch."""
        return self.transformer(input_ids, positions, kv_caches, metadata)

    def input_embedding(self) -> nn.Module:
        """The token embedding table, which draft heads read."""
        return self.transformer.word_embeddings

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def _read_hf(config: dict[str, Any]) -> ModelConfig:
    """Falcon-7B-style configs; ALiBi, Falcon-40B's grouped layout and sequential blocks are refused by name."""
    if config.get("alibi") or config.get("new_decoder_architecture") or not config.get("parallel_attn", True):
        raise ValueError(
            "ember runs Falcon-7B-style models (parallel attention, rotary, multi-query or MHA); "
            "ALiBi, new_decoder_architecture (Falcon-40B) and sequential blocks are not supported"
        )
    if config.get("activation", "gelu") != "gelu":
        raise ValueError(f"Falcon activation {config['activation']!r} is not supported; ember runs gelu")
    hidden = config["hidden_size"]
    num_heads = config["num_attention_heads"]
    bias = bool(config.get("bias", False))
    return ModelConfig(
        architecture="falcon",
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config.get("ffn_hidden_size") or 4 * hidden,
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=1 if config.get("multi_query", True) else num_heads,
        head_dim=hidden // num_heads,
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        rope_theta=hf_rope_theta(config),
        rope_scaling=hf_rope_scaling(config),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        output_bias=bias,
        mlp_bias=bias,
        hidden_act="gelu",
        layer_norm_eps=config.get("layer_norm_epsilon", 1e-5),
    )


FAMILIES = (FamilySpec("falcon", FalconForCausalLM, _read_hf, quantize_formats=("safetensors",)),)
