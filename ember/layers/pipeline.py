"""Pipeline parallelism: one stage's part of a decoder, and the activations it sends to the next stage.

A `DecoderModel` (embedding, layers, final norm) is cut into contiguous layer ranges, one per
rank. Stage 0 (rank 0, the engine) embeds the tokens and runs its layers; each later stage
receives the hidden states from the one before, runs its layers, and passes them on; the last
stage applies the final norm and sends the result back to rank 0, which holds the LM head and
samples. Each rank runs only its layers, so each layer computes exactly what it computes in one
process: pipeline parallelism changes no number.

Activations travel as float32 (lossless for bfloat16, the compute dtype of float32 weights and of
bfloat16 weights on the packed CPU kernels) and arrive as float32.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.layers.attention import AttentionMetadata
from ember.layers.collectives import PointToPoint

WIRE_DTYPE = torch.float32


class PipelineStage(nn.Module):
    """Layers `held_layers` of a decoder (same child names, so checkpoint names map); the rest are empty placeholders.

    `embed_tokens` lives on the first stage only and `norm` on the last; the others hold None. `communicator`
    numbers the stages (a stage that is a tensor-parallel group sends between its ranks and the next stage's peers).
    """

    def __init__(self, decoder: nn.Module, held_layers: range, communicator: PointToPoint) -> None:
        super().__init__()
        self.communicator = communicator
        self.is_first = communicator.rank == 0
        self.is_last = communicator.rank == communicator.world_size - 1
        self.held_layers = held_layers
        self.hidden_size = decoder.embed_tokens.embedding_dim
        self.embed_tokens = decoder.embed_tokens if self.is_first else None
        self.layers = nn.ModuleList(
            layer if index in held_layers else nn.Module() for index, layer in enumerate(decoder.layers)
        )
        self.norm = decoder.norm if self.is_last else None
        self.layer_groups = decoder.layer_groups

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor | None:
        """Rank 0: the final hidden states [num_tokens, hidden] (after the last stage's norm); others: None."""
        communicator = self.communicator
        shape = (input_ids.shape[0], self.hidden_size)
        if self.is_first:
            h = self.embed_tokens(input_ids)
        else:
            h = communicator.receive(shape, WIRE_DTYPE, communicator.rank - 1)
        for index in self.held_layers:
            h = self.layers[index](h, positions, kv_caches[index], metadata.for_group(self.layer_groups[index]))
        if self.is_last:
            h = self.norm(h)
        communicator.send(h.to(WIRE_DTYPE), (communicator.rank + 1) % communicator.world_size)
        if self.is_first:
            return communicator.receive(shape, WIRE_DTYPE, communicator.world_size - 1)
        return None
