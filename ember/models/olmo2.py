"""OLMo 2: the Llama block with its norms after each branch instead of before it.

The attention's output goes through `post_attention_layernorm` and the MLP's through `post_feedforward_layernorm`
before each joins the residual (nothing is normed on the way in), and queries and keys are RMS-normed over their
whole projection, every head at once, before the rotation. Its blocks run on the layers' Python path (the compiled
block norms before each branch); their products are the compiled GEMMs all the same.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.attention import AttentionMetadata
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.models.config_reading import HFDefaults, llama_like_reader
from ember.models.decoder import DecoderForCausalLM
from ember.models.family_spec import FamilySpec, GGUFReading
from ember.models.llama import LlamaAttention, LlamaMLP


class Olmo2Attention(LlamaAttention):
    """Llama's attention with `q_norm` over all query heads together and `k_norm` over all key heads together."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        self.q_norm = RMSNorm(self.q_size, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.kv_size, config.rms_norm_eps)

    def _norm_heads(self, heads: torch.Tensor) -> None:
        """q_norm over each token's queries and k_norm over its keys (heads [tokens, heads, head_dim]), in place."""
        tokens, queries = heads.shape[0], heads[:, : self.num_heads]
        keys = heads[:, self.num_heads : self.num_heads + self.num_kv_heads]
        queries.copy_(self.q_norm(queries.reshape(tokens, self.q_size)).view_as(queries))
        keys.copy_(self.k_norm(keys.reshape(tokens, self.kv_size)).view_as(keys))


class Olmo2DecoderLayer(nn.Module):
    """h = x + post_attention_norm(attn(x)); out = h + post_feedforward_norm(mlp(h))."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = Olmo2Attention(config, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        h = x + self.post_attention_layernorm(self.self_attn(x, positions, kv_cache, metadata))
        return h + self.post_feedforward_layernorm(self.mlp(h))


class Olmo2ForCausalLM(DecoderForCausalLM):
    """OLMo 2 (AllenAI's fully open models)."""

    def make_layer(self, layer_index: int, rotary: RotaryEmbedding) -> nn.Module:
        return Olmo2DecoderLayer(self.config, rotary)


FAMILIES = (
    FamilySpec("olmo2", Olmo2ForCausalLM, llama_like_reader(HFDefaults(rms_norm_eps=1e-5)),
               gguf=GGUFReading(("olmo2",), layer_names={"post_attention_norm": "post_attention_layernorm",
                                                         "post_ffw_norm": "post_feedforward_layernorm"}),
               quantize_formats=("safetensors",)),
)
