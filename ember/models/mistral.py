"""Mistral with its sliding window, and Qwen2/Llama with sliding layers (hybrid local/global).

The block is Llama's; what differs is the KV spec of each layer: a layer with a window of W
tokens attends to the last W keys only, and the KV manager gives back its blocks behind the
window as a request advances. Qwen2's `max_window_layers` makes the first layers global and the
rest windowed, so one model holds full KV only for its global layers.
"""

from __future__ import annotations

from torch import nn

from ember.layers.rotary import RotaryEmbedding
from ember.models.decoder import DecoderForCausalLM
from ember.models.llama import LlamaDecoderLayer


class MistralForCausalLM(DecoderForCausalLM):
    """Llama blocks over per-layer sliding-window (or full) KV specs."""

    def make_layer(self, layer_index: int, rotary: RotaryEmbedding) -> nn.Module:
        return LlamaDecoderLayer(self.config, rotary)
