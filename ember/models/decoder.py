"""The decoder skeleton most families share (Llama's too): embed, layers over their KV groups, norm, head.

Falcon, GPT-2, GPT-NeoX and OPT are modules of their own and do not use it.

A family supplies its decoder layer; the skeleton hands each layer its cache and the attention
metadata of its layer group (full or windowed), so the family's files hold only the block math.
Parameter names follow transformers (`model.embed_tokens`, `model.layers.N`, `model.norm`,
`lm_head`) so checkpoints map 1:1.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.kv.specs import KVCacheLayout, KVCacheSpec, kv_specs_for
from ember.layers.attention import AttentionMetadata
from ember.layers.cpu_decoder_layer import CompilableLayer, CompiledDecoderStack, FinalNorm
from ember.layers.embedding import VocabEmbedding
from ember.layers.linear import Linear
from ember.layers.norm import RMSNorm
from ember.layers.rotary import RotaryEmbedding
from ember.models.causal_lm import CausalLM

LayerFactory = Callable[[int, Any], nn.Module]


class DecoderModel(nn.Module):
    """Embedding, the decoder layers (each with its group's metadata), the final norm (RMSNorm unless given)."""

    def __init__(self, config: ModelConfig, make_layer: LayerFactory, specs: list[KVCacheSpec], rotary: Any,
                 norm: nn.Module | None = None) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(make_layer(i, rotary) for i in range(config.num_layers))
        self.norm = norm if norm is not None else RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layer_groups = KVCacheLayout.from_specs(specs).layer_groups
        self._stack: CompiledDecoderStack | None = None
        # Which layers are CompilableLayers, per set of layers: a runtime Protocol check costs ~20 us a layer, which
        # run every step was 7-10% of batch-1 decode.
        self._compilable_key: tuple[int, ...] = ()
        self._compilable: tuple[bool, ...] = ()
        self.embedding_multiplier = config.embedding_multiplier  # Granite's; 1 elsewhere

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        if self.embedding_multiplier != 1.0:
            h = h * self.embedding_multiplier
        stack = self.compiled_stack()
        if stack is not None:
            out = stack(h, positions, kv_caches, metadata.for_group(self.layer_groups[0]))
            if out is not None:
                return out if stack.applies_final_norm else self.norm(out)
        for layer, kv_cache, group in zip(self.layers, kv_caches, self.layer_groups, strict=True):
            h = layer(h, positions, kv_cache, metadata.for_group(group))
        return self.norm(h)

    def compiled_stack(self) -> CompiledDecoderStack | None:
        """Every layer as one compiled call, when all are compiled and share one attention group; the final
        RMSNorm runs inside it where the kernel takes its weight.

        Rebuilt whenever a layer's compiled form changes (quantized products swapped in, weights
        restored), so it never runs stale weights.
        """
        if len(set(self.layer_groups)) != 1:
            return None
        compiled = tuple(layer.compiled if is_compilable else None
                         for layer, is_compilable in zip(self.layers, self._compilable_layers(), strict=True))
        norm = self.norm
        final_norm = FinalNorm.of(norm.weight.detach(), norm.eps) if type(norm) is RMSNorm else None
        if self._stack is None or not self._stack.matches(compiled, final_norm):
            self._stack = CompiledDecoderStack.build(compiled, final_norm)
        return self._stack

    def _compilable_layers(self) -> tuple[bool, ...]:
        """Whether each layer is a `CompilableLayer`, checked again only when the layers themselves change."""
        key = tuple(map(id, self.layers))
        if key != self._compilable_key:
            self._compilable = tuple(isinstance(layer, CompilableLayer) for layer in self.layers)
            self._compilable_key = key
        return self._compilable


class DecoderForCausalLM(CausalLM):
    """A `DecoderModel` plus the LM head; subclasses give `make_layer` and (if not plain attention) specs, and
    (if not RMSNorm) the final norm; `lm_head_bias` where the head has one (Phi)."""

    lm_head_bias = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config, self.make_layer, self.kv_cache_specs(), self.make_rotary(), self.make_final_norm())
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=self.lm_head_bias)

    @abstractmethod
    def make_layer(self, layer_index: int, rotary: Any) -> nn.Module:
        """Decoder layer `layer_index`, sharing the model's rotary tables."""

    def make_final_norm(self) -> nn.Module | None:
        """The norm after the last layer (None: the skeleton's RMSNorm)."""
        return None

    def make_rotary(self) -> Any:
        """The rotary embedding every layer shares (Llama's half-split layout over head_dim)."""
        config = self.config
        return RotaryEmbedding(config.head_dim, config.rotary_table_positions, config.rope_theta, config.rope_scaling,
                               rotary_dim=config.rotary_dim)

    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """What each layer's KV cache holds; the runner allocates from this."""
        return kv_specs_for(self.config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Final hidden states [num_tokens, hidden] of the flat batch."""
        return self.model(input_ids, positions, kv_caches, metadata)

    def input_embedding(self) -> nn.Module:
        """The token embedding table (before any family's scaling), which draft heads read."""
        return self.model.embed_tokens

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's logits, divided by Granite's `logits_scaling` (1 elsewhere)."""
        logits = self.lm_head(hidden)
        return logits if self.config.logits_scaling == 1.0 else logits / self.config.logits_scaling
