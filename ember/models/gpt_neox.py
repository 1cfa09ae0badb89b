"""GPT-NeoX (EleutherAI's Pythia and GPT-NeoX-20B): partial rotary, parallel residual, LayerNorm, GELU MLP.

Each block adds attention and MLP branches to its input side by side (`use_parallel_residual`, Pythia's) or one
after the other, each reading its own LayerNorm. The fused `query_key_value` projection is laid out per head
([q, k, v] of head_dim each); rotary positions turn only the leading `partial_rotary_factor` of each head (a
quarter in Pythia), in the half-split layout. Pythia checkpoints call the LM head `embed_out`; ember reads it as
`lm_head`, as transformers 5 names it.
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
from ember.layers.rotary import RotaryEmbedding
from ember.models.causal_lm import CausalLM
from ember.models.config_reading import partial_rotary_decoder
from ember.models.family_spec import FamilySpec


class GPTNeoXAttention(nn.Module):
    """Multi-head attention over a per-head fused q/k/v projection, partial rotary positions."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.scale = config.head_dim**-0.5
        self.query_key_value = Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.dense = Linear(config.hidden_size, config.hidden_size, bias=config.output_bias)
        self.rotary = rotary

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.query_key_value(x).view(num_tokens, self.num_heads, 3, self.head_dim).unbind(2)
        q, k = self.rotary(positions, q, k)
        out = paged_attention(q, k, v, kv_cache, metadata, self.scale)
        return self.dense(out.reshape(num_tokens, -1))


class GPTNeoXMLP(nn.Module):
    """dense_4h_to_h(act(dense_h_to_4h(x))), act the config's hidden_act (GELU in Pythia)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.dense_4h_to_h = Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.activation = activation(config.hidden_act, "GPT-NeoX")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.activation(self.dense_h_to_4h(x)))


class GPTNeoXLayer(nn.Module):
    """Parallel: out = x + attn(ln1(x)) + mlp(ln2(x)); sequential: h = x + attn(ln1(x)), out = h + mlp(ln2(h))."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.parallel = config.parallel_residual
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = GPTNeoXAttention(config, rotary)
        self.mlp = GPTNeoXMLP(config)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = x + self.attention(self.input_layernorm(x), positions, kv_cache, metadata)
        return h + self.mlp(self.post_attention_layernorm(x if self.parallel else h))


class GPTNeoXModel(nn.Module):
    """Embedding, the blocks, the final LayerNorm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_in = nn.Embedding(config.vocab_size, config.hidden_size)
        rotary = RotaryEmbedding(config.head_dim, config.rotary_table_positions, config.rope_theta, config.rope_scaling,
                                 rotary_dim=config.rotary_dim)  # fmt: skip
        self.layers = nn.ModuleList(GPTNeoXLayer(config, rotary) for _ in range(config.num_layers))
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = self.embed_in(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, positions, kv_cache, metadata)
        return self.final_layer_norm(h)


class GPTNeoXForCausalLM(CausalLM):
    """GPT-NeoX with its own LM head (tied only where the config says); names follow transformers."""

    tied_weights = {"lm_head.weight": "gpt_neox.embed_in.weight"}
    checkpoint_prefixes = {"embed_out.": "lm_head."}  # Pythia's name for the head

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.gpt_neox = GPTNeoXModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)

    def is_derived_tensor(self, name: str) -> bool:
        """Older checkpoints carry causal-mask buffers and rotary frequencies; ember builds both itself."""
        return name.endswith((".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq"))

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        return [FullAttentionSpec(self.config.num_heads, self.config.head_dim)] * self.config.num_layers

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Final hidden states [num_tokens, hidden] of the flat batch."""
        return self.gpt_neox(input_ids, positions, kv_caches, metadata)

    def input_embedding(self) -> nn.Module:
        """The token embedding table, which draft heads read."""
        return self.gpt_neox.embed_in

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def _read_hf(config: dict[str, Any]) -> ModelConfig:
    """GPT-NeoX / Pythia, its rotary settings as transformers 5 writes them (`rope_parameters`) or as older configs
    did (`rotary_pct`, `rotary_emb_base`, `rope_scaling`)."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    partial = float(parameters.get("partial_rotary_factor") or config.get("rotary_pct") or 0.25)
    theta = float(parameters.get("rope_theta") or config.get("rotary_emb_base") or config.get("rope_theta") or 10_000.0)
    bias = bool(config.get("attention_bias", True))
    return ModelConfig(
        architecture="gpt_neox",
        **partial_rotary_decoder(config, parameters, partial, "rotary_pct", theta, max_positions=2048),
        qkv_bias=bias,
        output_bias=bias,
        mlp_bias=True,
        hidden_act=config.get("hidden_act", "gelu"),
        parallel_residual=bool(config.get("use_parallel_residual", True)),
    )


FAMILIES = (FamilySpec("gpt_neox", GPTNeoXForCausalLM, _read_hf),)
