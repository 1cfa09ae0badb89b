"""`CausalLM`: what every family's model is to the rest of ember, declared once.

The loader reads `tied_weights`, `checkpoint_prefixes` and `is_derived_tensor`; the runner `forward`,
`compute_logits` and `kv_cache_specs`; speculative heads and quantize `input_embedding`; AWQ and SmoothQuant
`input_norms`. Every registered family subclasses it (tests/models/test_causal_lm.py builds each and holds it to
the contract), so nothing discovers a family's abilities by probing its attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.kv.specs import KVCacheSpec
from ember.layers.attention import AttentionMetadata


class CausalLM(nn.Module, ABC):
    """A decoder-only language model over a paged KV cache, with parameters named as its transformers checkpoints
    name them."""

    config: ModelConfig
    # Weights a checkpoint leaves out when config.tie_word_embeddings, each read from the weight it names.
    tied_weights: Mapping[str, str] = MappingProxyType({"lm_head.weight": "model.embed_tokens.weight"})
    # Checkpoint name prefixes this model names otherwise (Pythia's `embed_out.` is our `lm_head.`).
    checkpoint_prefixes: Mapping[str, str] = MappingProxyType({})

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Final hidden states [num_tokens, hidden] of the flat batch."""

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [num_tokens, vocab] of final hidden states (with any family's scaling or soft-capping)."""

    @abstractmethod
    def kv_cache_specs(self) -> list[KVCacheSpec]:
        """What each layer's KV cache holds, one spec per layer; the runner allocates from this."""

    @abstractmethod
    def input_embedding(self) -> nn.Module:
        """The token embedding table (before any family's scaling or positions), which draft heads read."""

    def is_derived_tensor(self, name: str) -> bool:
        """Whether checkpoint tensor `name` is computed, not loaded (rotary frequencies; GPT-2's mask buffers)."""
        return name.endswith("rotary_emb.inv_freq")

    def input_norms(self) -> list[tuple[nn.Module, nn.Module]] | None:
        """Per decoder layer, the norms whose outputs attention and the MLP read (into which AWQ and SmoothQuant fold
        their input scales); None where the blocks have no such pair (experts, post-norm or parallel blocks)."""
        return None
