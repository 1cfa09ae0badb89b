"""The Llama family (Llama 2/3, Mistral without its window, Qwen2, SmolLM2) over a paged KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.layers.attention import AttentionMetadata, paged_attention
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.models.config import ModelConfig


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with rotary positions; K/V live in the layer's cache.

    Q, K and V come from one fused projection (`qkv_proj`, packed from the checkpoint's
    q_proj / k_proj / v_proj at load): one matrix product instead of three.
    """

    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        hidden = config.hidden_size
        self.qkv_proj = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=config.output_bias)
        self.rotary = rotary

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads = self.qkv_proj(x).view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        # Queries and keys are adjacent heads of the fused output: one rotation covers both.
        qk = self.rotary.rotate(positions, heads[:, : self.num_heads + self.num_kv_heads])
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = heads[:, self.num_heads + self.num_kv_heads :]
        out = paged_attention(q, k, v, kv_cache, metadata, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up in one fused product."""

    packed_modules = {"gate_up_proj": ("gate_proj", "up_proj")}

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Linear(hidden, 2 * inner, bias=config.mlp_bias)
        self.down_proj = nn.Linear(inner, hidden, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + mlp(norm(h))."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), positions, kv_cache, metadata)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """Embedding, the decoder layers, the final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        rotary = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, rotary) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, positions, kv_cache, metadata)
        return self.norm(h)


class LlamaForCausalLM(nn.Module):
    """The decoder plus the LM head; parameter names follow transformers' so checkpoints map 1:1."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Final hidden states [num_tokens, hidden] of the flat batch."""
        return self.model(input_ids, positions, kv_caches, metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
