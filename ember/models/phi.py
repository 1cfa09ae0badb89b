"""Phi (Microsoft's phi-1, phi-1.5 and phi-2): a parallel block over one LayerNorm, partial rotary, biases throughout.

Each block reads a single LayerNorm and adds attention and MLP side by side: out = x + attn(ln(x)) + mlp(ln(x)).
Rotary positions turn only the leading `partial_rotary_factor` of each head (half in phi-1 and phi-1.5, 0.4 in
phi-2), in the half-split layout. q/k/v projections (packed into one at load) may group query heads over fewer
key/value heads (`num_key_value_heads`), and with `qk_layernorm` every query and key head is LayerNormed over
head_dim before the rotation. The MLP is fc2(act(fc1(x))), `gelu_new` in the released models. Every linear has a
bias, the LM head's included (tied to the token embedding only where the config says; its bias stays its own).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.activation import activation
from ember.layers.attention import AttentionMetadata
from ember.layers.linear import Linear
from ember.layers.rotary import RotaryEmbedding
from ember.models.config_reading import (
    first_given,
    gguf_layer_norms,
    partial_rotary_decoder,
    tensor_biases,
)
from ember.models.decoder import DecoderForCausalLM
from ember.models.family_spec import FamilySpec, GGUFReading
from ember.models.grouped_attention import FusedQKVAttention


class PhiAttention(FusedQKVAttention):
    """Grouped-query attention (`FusedQKVAttention`) with optional q/k LayerNorms (one each, shared by the heads) and a
    biased output projection, `dense`."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        self.dense = Linear(self.query_size, config.hidden_size, bias=config.output_bias)
        self.q_layernorm = nn.LayerNorm(self.head_dim, eps=config.layer_norm_eps) if config.qk_norm else None
        self.k_layernorm = nn.LayerNorm(self.head_dim, eps=config.layer_norm_eps) if config.qk_norm else None

    def norm_heads(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (q, k) if self.q_layernorm is None else (self.q_layernorm(q), self.k_layernorm(k))

    def project_out(self, attended: torch.Tensor) -> torch.Tensor:
        return self.dense(attended)


class PhiMLP(nn.Module):
    """fc2(act(fc1(x))), act the config's hidden_act (gelu_new in the released models)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc1 = Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.fc2 = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.activation = activation(config.hidden_act, "Phi")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class PhiDecoderLayer(nn.Module):
    """Parallel block: n = ln(x); out = x + attn(n) + mlp(n)."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = PhiAttention(config, rotary)
        self.mlp = PhiMLP(config)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        n = self.input_layernorm(x)
        return x + self.self_attn(n, positions, kv_cache, metadata) + self.mlp(n)


class PhiForCausalLM(DecoderForCausalLM):
    """Phi on the shared decoder, ending in a LayerNorm (`final_layernorm` in its checkpoints), with an LM head that has
    a bias (its weight tied only where the config says; the bias stays its own); names otherwise follow transformers."""

    tied_weights = {"lm_head.weight": "model.embed_tokens.weight"}
    checkpoint_prefixes = {"model.final_layernorm.": "model.norm."}
    lm_head_bias = True

    def make_layer(self, layer_index: int, rotary: RotaryEmbedding) -> nn.Module:
        return PhiDecoderLayer(self.config, rotary)

    def make_final_norm(self) -> nn.Module:
        return nn.LayerNorm(self.config.hidden_size, eps=self.config.layer_norm_eps)


def _read_hf(config: dict[str, Any]) -> ModelConfig:
    """Phi (phi-1, phi-1.5, phi-2), its rotary settings as transformers 5 writes them (`rope_parameters`) or as older
    configs did (top-level `partial_rotary_factor`, `rope_theta`, `rope_scaling`); a key inside the dict wins, as in
    transformers. Every linear has a bias; half of each head rotates unless the config says otherwise."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    partial = float(first_given(parameters.get("partial_rotary_factor"), config.get("partial_rotary_factor"), 0.5))
    theta = float(first_given(parameters.get("rope_theta"), config.get("rope_theta"), 10_000.0))
    return ModelConfig(
        architecture="phi",
        **partial_rotary_decoder(config, parameters, partial, "partial_rotary_factor", theta, max_positions=2048),
        qkv_bias=True,
        qk_norm=bool(config.get("qk_layernorm", False)),
        output_bias=True,
        mlp_bias=True,
        hidden_act=config.get("hidden_act", "gelu_new"),
    )


FAMILIES = (
    FamilySpec("phi", PhiForCausalLM, _read_hf,
               gguf=GGUFReading(("phi2",), read_fields=lambda key: gguf_layer_norms(key, "gelu_new"), from_tensors=tensor_biases,
                                rotates_part_of_head=True,
                                layer_names={"attn_output": "self_attn.dense", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"})),
)
