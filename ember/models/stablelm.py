"""StableLM (Stability AI's StableLM-3B-4E1T and StableLM-2 1.6B / 12B).

A Llama-like decoder with LayerNorm (weight and bias) where Llama has RMSNorm, before each branch and at the end.
Attention is grouped-query with rotary positions on only the leading `partial_rotary_factor` of each head (a quarter
in every released model), in the half-split layout; q/k/v carry biases where `use_qkv_bias` says (StableLM-2), the
output projection never does. With `qk_layernorm` (StableLM-2-12B) every query and key head is normed over head_dim
by a LayerNorm of its own (a weight per head, no bias) before the rotation. With `use_parallel_residual` (12B as
well) a block has one input LayerNorm whose output feeds attention and the MLP side by side. The MLP is SwiGLU
(gate / up / down, no biases). The LM head is its own matrix unless the config ties it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.attention import AttentionMetadata
from ember.layers.linear import Linear
from ember.layers.rotary import RotaryEmbedding
from ember.models.decoder import DecoderForCausalLM
from ember.models.grouped_attention import FusedQKVAttention
from ember.models.llama import LlamaMLP


class LayerNormPerHead(nn.Module):
    """A bias-free LayerNorm over head_dim for each of `num_heads` heads, each with its own weight.

    The weights stay one `norms.N.weight` per head, as checkpoints name them; the forward normalises every head at
    once and scales each by its row of the stacked weights.
    """

    def __init__(self, head_dim: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.head_dim, self.eps = head_dim, eps
        self.norms = nn.ModuleList(nn.LayerNorm(head_dim, eps=eps, bias=False) for _ in range(num_heads))

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        """heads [tokens, num_heads, head_dim] -> the same shape, each head normed by its own LayerNorm."""
        weight = torch.stack([norm.weight for norm in self.norms])
        return F.layer_norm(heads, (self.head_dim,), eps=self.eps) * weight


class StableLmAttention(FusedQKVAttention):
    """Grouped-query attention (`FusedQKVAttention`) with optional per-head q/k LayerNorms and a bias-free `o_proj`."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        self.o_proj = Linear(self.query_size, config.hidden_size, bias=False)
        eps = config.layer_norm_eps
        self.q_layernorm = LayerNormPerHead(self.head_dim, self.num_heads, eps) if config.qk_norm else None
        self.k_layernorm = LayerNormPerHead(self.head_dim, self.num_kv_heads, eps) if config.qk_norm else None

    def norm_heads(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (q, k) if self.q_layernorm is None else (self.q_layernorm(q), self.k_layernorm(k))

    def project_out(self, attended: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attended)


class StableLmDecoderLayer(nn.Module):
    """Sequential: h = x + attn(ln1(x)), out = h + mlp(ln2(h)); parallel: out = x + attn(ln1(x)) + mlp(ln1(x))."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.input_layernorm = nn.LayerNorm(hidden, eps=eps)
        self.self_attn = StableLmAttention(config, rotary)
        self.post_attention_layernorm = None if config.parallel_residual else nn.LayerNorm(hidden, eps=eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        normed = self.input_layernorm(x)
        h = x + self.self_attn(normed, positions, kv_cache, metadata)
        is_parallel = self.post_attention_layernorm is None
        return h + self.mlp(normed if is_parallel else self.post_attention_layernorm(h))


class StableLmForCausalLM(DecoderForCausalLM):
    """StableLM on the shared decoder, ending in a LayerNorm, with its own LM head (tied only where the config says);
    names follow transformers."""

    tied_weights = {"lm_head.weight": "model.embed_tokens.weight"}

    def make_layer(self, layer_index: int, rotary: RotaryEmbedding) -> nn.Module:
        return StableLmDecoderLayer(self.config, rotary)

    def make_final_norm(self) -> nn.Module:
        return nn.LayerNorm(self.config.hidden_size, eps=self.config.layer_norm_eps)
