"""Grouped-query attention over one fused q/k/v projection, the part the LayerNorm families (Phi, StableLM) share.

The checkpoint's q_proj / k_proj / v_proj are packed into `qkv_proj` at load. A family adds what differs: its head
norms (`norm_heads`) and its output projection (`project_out`), under its own checkpoint names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.attention import AttentionMetadata, paged_attention
from ember.layers.linear import Linear
from ember.layers.rotary import RotaryEmbedding


class FusedQKVAttention(nn.Module, ABC):
    """q/k/v from one product, query heads grouped over `num_kv_heads`, rotary positions, scaled by head_dim ** -0.5."""

    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.scale = config.head_dim**-0.5
        self.query_size = self.num_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.query_size + 2 * self.num_kv_heads * self.head_dim, bias=config.qkv_bias)
        self.rotary = rotary

    def norm_heads(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys [tokens, heads, head_dim] before the rotation (as they are, unless the family norms them)."""
        return q, k

    @abstractmethod
    def project_out(self, attended: torch.Tensor) -> torch.Tensor:
        """The attention output [tokens, query heads * head_dim] back to the hidden size."""

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads = self.qkv_proj(x).view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q, k, v = heads.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=1)
        q, k = self.rotary(positions, *self.norm_heads(q, k))
        return self.project_out(paged_attention(q, k, v, kv_cache, metadata, self.scale).reshape(num_tokens, -1))
