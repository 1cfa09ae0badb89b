"""OPT (Meta's Open Pre-trained Transformers, e.g. facebook/opt-125m, vLLM's quickstart model).

Learned positions offset by 2 (OPT's embedding table keeps two rows before position 0), LayerNorm before
(OPT-125m and most sizes) or after (OPT-350m: `do_layer_norm_before` false) each branch, ReLU MLP, multi-head
attention with biases, and, where the token embedding is narrower than the model (OPT-350m's 512 in a 1024-wide
model), projections in and out of it. The LM head is tied to the token embedding. Checkpoints of the bare model
name their tensors `decoder.*`; ember reads them as `model.decoder.*`, as transformers does.
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

POSITION_OFFSET = 2  # OPT's learned position table starts two rows before position 0


class OPTAttention(nn.Module):
    """Multi-head attention, q/k/v fused at load (`qkv_proj`), no rotary (positions are in the input)."""

    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.scale = config.head_dim**-0.5
        self.qkv_proj = Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.out_proj = Linear(config.hidden_size, config.hidden_size, bias=config.output_bias)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).view(num_tokens, 3, self.num_heads, self.head_dim).unbind(1)
        out = paged_attention(q, k, v, kv_cache, metadata, self.scale)
        return self.out_proj(out.reshape(num_tokens, -1))


class OPTDecoderLayer(nn.Module):
    """h = x + attn(ln(x)); out = h + fc2(act(fc1(ln(h)))) (pre-norm), or each sum normed after (post-norm)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.norm_before = config.layer_norm_before
        self.self_attn = OPTAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = Linear(hidden, config.intermediate_size, bias=config.mlp_bias)
        self.fc2 = Linear(config.intermediate_size, hidden, bias=config.mlp_bias)
        self.final_layer_norm = nn.LayerNorm(hidden, eps=eps)
        self.activation = activation(config.hidden_act, "OPT")

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        attended = self.self_attn(self.self_attn_layer_norm(x) if self.norm_before else x, kv_cache, metadata)
        h = x + attended if self.norm_before else self.self_attn_layer_norm(x + attended)
        mixed = self.fc2(self.activation(self.fc1(self.final_layer_norm(h) if self.norm_before else h)))
        return h + mixed if self.norm_before else self.final_layer_norm(h + mixed)


class OPTDecoder(nn.Module):
    """Token embedding (projected in where narrower) plus learned positions, the layers, the final LayerNorm
    (pre-norm models only), the projection out."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, width = config.hidden_size, config.embedding_width
        self.embed_tokens = nn.Embedding(config.vocab_size, width)
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, hidden)
        self.project_in = Linear(width, hidden, bias=False) if width != hidden else None
        self.layers = nn.ModuleList(OPTDecoderLayer(config) for _ in range(config.num_layers))
        self.final_layer_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps) if config.layer_norm_before else None
        self.project_out = Linear(hidden, width, bias=False) if width != hidden else None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        tokens = self.embed_tokens(input_ids)
        h = (tokens if self.project_in is None else self.project_in(tokens)) + self.embed_positions(positions + POSITION_OFFSET)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, kv_cache, metadata)
        if self.final_layer_norm is not None:
            h = self.final_layer_norm(h)
        return h if self.project_out is None else self.project_out(h)


class OPTModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(CausalLM):
    """OPT with its LM head tied to the token embedding; names follow transformers."""

    tied_weights = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
    checkpoint_prefixes = {"decoder.": "model.decoder."}  # a bare OPTModel checkpoint (facebook/opt-*)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = OPTModel(config)
        self.lm_head = Linear(config.embedding_width, config.vocab_size, bias=False)

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        return [FullAttentionSpec(self.config.num_heads, self.config.head_dim)] * self.config.num_layers

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Final hidden states [num_tokens, embedding width] of the flat batch."""
        return self.model.decoder(input_ids, positions, kv_caches, metadata)

    def input_embedding(self) -> nn.Module:
        """The token embedding table (without positions), which draft heads read."""
        return self.model.decoder.embed_tokens

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def _read_hf(config: dict[str, Any]) -> ModelConfig:
    """OPT: learned positions, LayerNorm before (or after) each branch, ReLU, biases (`enable_bias`), the token
    embedding `word_embed_proj_dim` wide."""
    if config.get("_remove_final_layer_norm") or not config.get("layer_norm_elementwise_affine", True):
        raise ValueError("OPT without a final LayerNorm or with weightless LayerNorms is not supported")
    hidden = config["hidden_size"]
    num_heads = config["num_attention_heads"]
    bias = bool(config.get("enable_bias", True))
    return ModelConfig(
        architecture="opt",
        vocab_size=config["vocab_size"],
        hidden_size=hidden,
        intermediate_size=config["ffn_dim"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=hidden // num_heads,
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        output_bias=bias,
        mlp_bias=bias,
        hidden_act=config.get("activation_function", "relu"),
        layer_norm_before=bool(config.get("do_layer_norm_before", True)),
        embedding_dim=config.get("word_embed_proj_dim") or hidden,
    )


FAMILIES = (FamilySpec("opt", OPTForCausalLM, _read_hf),)
