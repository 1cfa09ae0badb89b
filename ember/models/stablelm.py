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

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.attention import AttentionMetadata
from ember.layers.linear import Linear
from ember.layers.rotary import RotaryEmbedding
from ember.models.config_reading import gguf_layer_norms, partial_rotary_decoder, tensor_biases
from ember.models.decoder import DecoderForCausalLM
from ember.models.family_spec import FamilySpec, GGUFReading
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


def _read_hf(config: dict[str, Any]) -> ModelConfig:
    """StableLM, its rotary settings as transformers 5 writes them (`rope_parameters`) or as the hub's configs do
    (`rope_theta`, `partial_rotary_factor` and `rope_scaling` beside the rest); a key inside the dict wins, as in
    transformers, and a quarter of each head rotates unless the config says otherwise. A rope type ember cannot
    compute is refused by name (`hf_rope_scaling`)."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    partial = float(parameters.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25)))
    theta = float(parameters.get("rope_theta", config.get("rope_theta", 10_000.0)))
    head_dim = config["hidden_size"] // config["num_attention_heads"]  # StableLM derives it; a head_dim key is not read
    return ModelConfig(
        architecture="stablelm",
        **partial_rotary_decoder(config, parameters, partial, "partial_rotary_factor", theta, max_positions=4096,
                                  head_dim=head_dim),
        qkv_bias=bool(config.get("use_qkv_bias", False)),
        qk_norm=bool(config.get("qk_layernorm", False)),
        hidden_act=config.get("hidden_act", "silu"),
        parallel_residual=bool(config.get("use_parallel_residual", False)),
    )


def _tensor_fields(config: ModelConfig, tensor_names: frozenset[str]) -> ModelConfig:
    """The biases a StableLM GGUF holds; a block without an ffn_norm adds attention and MLP side by side
    (use_parallel_residual)."""
    if "blk.0.attn_q_norm.weight" in tensor_names:
        raise ValueError("this StableLM GGUF has per-head q/k norms (qk_layernorm): ember reads those from HF folders only")
    return replace(tensor_biases(config, tensor_names), parallel_residual="blk.0.ffn_norm.weight" not in tensor_names)


FAMILIES = (
    FamilySpec("stablelm", StableLmForCausalLM, _read_hf,
               gguf=GGUFReading(("stablelm",), read_fields=lambda key: gguf_layer_norms(key, "silu"), from_tensors=_tensor_fields,
                                rotates_part_of_head=True)),
)
