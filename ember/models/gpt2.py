"""GPT-2: learned positions, LayerNorm, GELU, multi-head attention, Conv1D-layout weights with biases.

transformers keeps GPT-2's weights in Conv1D layout ([in, out], `y = x @ W + b`); ember keeps
that layout too, so checkpoint tensors load as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.kv.specs import FullAttentionSpec, KVCacheSpec
from ember.layers.activation import activation
from ember.layers.attention import AttentionMetadata, paged_attention
from ember.layers.linear import Linear
from ember.models.causal_lm import CausalLM
from ember.models.family_spec import FamilySpec


class Conv1D(nn.Module):
    """A linear layer stored transposed, as GPT-2 checkpoints store it: weight [in, out]."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight)


class GPT2Attention(nn.Module):
    """Multi-head attention: one fused QKV projection, no rotary (positions are in the input)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.c_attn = Conv1D(config.hidden_size, 3 * config.hidden_size)
        self.c_proj = Conv1D(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.c_attn(x).view(num_tokens, 3, self.num_heads, self.head_dim).unbind(1)
        out = paged_attention(q, k, v, kv_cache, metadata, self.scale)
        return self.c_proj(out.reshape(num_tokens, -1))


class GPT2MLP(nn.Module):
    """proj(act(fc(x))), act the config's activation_function (gelu_new in GPT-2)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.c_fc = Conv1D(config.hidden_size, config.intermediate_size)
        self.c_proj = Conv1D(config.intermediate_size, config.hidden_size)
        self.activation = activation(config.hidden_act, "GPT-2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.activation(self.c_fc(x)))


class GPT2Block(nn.Module):
    """Pre-LayerNorm block: h = x + attn(ln_1(x)); out = h + mlp(ln_2(h))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = GPT2MLP(config)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        h = x + self.attn(self.ln_1(x), kv_cache, metadata)
        return h + self.mlp(self.ln_2(h))


class GPT2Model(nn.Module):
    """Token plus learned position embeddings, the blocks, the final LayerNorm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.h = nn.ModuleList(GPT2Block(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = self.wte(input_ids) + self.wpe(positions)
        for block, kv_cache in zip(self.h, kv_caches, strict=True):
            h = block(h, kv_cache, metadata)
        return self.ln_f(h)


class GPT2LMHeadModel(CausalLM):
    """GPT-2 with its LM head tied to the token embedding; names follow transformers."""

    tied_weights = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    def is_derived_tensor(self, name: str) -> bool:
        """Old GPT-2 checkpoints carry their causal-mask buffers; ember builds masks per step."""
        return name.endswith((".attn.bias", ".attn.masked_bias"))

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        return [FullAttentionSpec(self.config.num_heads, self.config.head_dim)] * self.config.num_layers

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Final hidden states [num_tokens, hidden] of the flat batch."""
        return self.transformer(input_ids, positions, kv_caches, metadata)

    def input_embedding(self) -> nn.Module:
        """The token embedding table (without positions), which draft heads read."""
        return self.transformer.wte

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def _read_hf(config: dict[str, Any]) -> ModelConfig:
    """GPT-2's config.json (`n_embd`, `n_head`, ...): decoder-only, attention scaled by head_dim ** -0.5."""
    if config.get("scale_attn_by_inverse_layer_idx") or not config.get("scale_attn_weights", True):
        raise ValueError("GPT-2 with scale_attn_by_inverse_layer_idx or without scale_attn_weights is not supported")
    if config.get("add_cross_attention"):
        raise ValueError("GPT-2 with cross-attention is an encoder-decoder; ember runs decoder-only GPT-2")
    hidden = config["n_embd"]
    num_heads = config["n_head"]
    return ModelConfig(
        architecture="gpt2",
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config.get("n_inner") or 4 * hidden,
        num_layers=config["n_layer"],
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=hidden // num_heads,
        max_position_embeddings=config.get("n_positions", 1024),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=True,
        output_bias=True,
        mlp_bias=True,
        hidden_act=config.get("activation_function", "gelu_new"),
        layer_norm_eps=config.get("layer_norm_epsilon", 1e-5),
    )


FAMILIES = (FamilySpec("gpt2", GPT2LMHeadModel, _read_hf),)
