"""Sequence parallelism on top of tensor parallelism: norms and residuals run on 1/W of the tokens.

Where tensor parallelism all-reduces a row-parallel output ([tokens, hidden], whole on every
rank), sequence parallelism reduce-scatters it: each rank keeps the summed rows of its block of
tokens, and the residual add and the next RMSNorm run on that block only. The norm's output,
which the next column-parallel product (QKV, gate-up, or the head) reads for every token, is
all-gathered; the residual stream itself stays split. A ring all-reduce is a reduce-scatter followed by an all-gather, so the bytes are
the same; what changes is that the per-token work between the products (norms, residual adds)
and the activations held between them shrink to 1/W. The sums are the same two partial sums
added the same way, so the numbers are tensor parallelism's, bit for bit.

The flat batch is padded with zero rows to a multiple of W for the split. The token count of the
current forward pass is the one fact the layers share (`SequenceSplit`): the embedding, first to
see the batch, writes it; the layers after it in the same pass read it to drop the padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.layers.collectives import Collectives
from ember.layers.norm import RMSNorm
from ember.layers.parallel import (
    RowParallelLinear,
    RowParallelProduct,
    VocabParallelEmbedding,
    VocabParallelLookup,
)


class SequenceSplit:
    """The token count of the forward pass in flight, and the padded size its blocks are cut from."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.num_tokens = 0

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """`x` [num_tokens, ...] with zero rows appended up to a multiple of the world size."""
        missing = -x.shape[0] % self.world_size
        return F.pad(x, (0, 0, 0, missing)) if missing else x

    def gather(self, block: torch.Tensor, communicator: Collectives) -> torch.Tensor:
        """Every rank's block of tokens, stacked, without the padding."""
        return communicator.all_gather(block)[: self.num_tokens]


class SequenceParallelEmbedding(VocabParallelEmbedding):
    """The vocabulary-parallel lookup, reduce-scattered: this rank's block of tokens."""

    def __init__(self, vocab_start: int, num_rows: int, hidden_size: int, communicator: Collectives, split: SequenceSplit) -> None:
        super().__init__(vocab_start, num_rows, hidden_size, communicator)
        self.split = split

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.split.num_tokens = input_ids.shape[0]
        return self.communicator.reduce_scatter(self.split.pad(self.lookup(input_ids)))

    def joining(self, local: nn.Module) -> nn.Module:
        return SequenceParallelLookup(local, self.vocab_start, self.num_embeddings, self.communicator, self.split)


class SequenceParallelLookup(VocabParallelLookup):
    """`SequenceParallelEmbedding` over this rank's rows held in another form (`local`)."""

    def __init__(self, local: nn.Module, vocab_start: int, num_rows: int, communicator: Collectives, split: SequenceSplit) -> None:
        super().__init__(local, vocab_start, num_rows, communicator)
        self.split = split

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.split.num_tokens = input_ids.shape[0]
        return self.communicator.reduce_scatter(self.split.pad(self.lookup(input_ids)))


class SequenceParallelRowLinear(RowParallelLinear):
    """The row-parallel partial product, reduce-scattered: the summed rows of this rank's block of tokens."""

    def __init__(self, in_features: int, out_features: int, bias: bool, communicator: Collectives, split: SequenceSplit) -> None:
        super().__init__(in_features, out_features, bias, communicator)
        self.split = split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.communicator.reduce_scatter(self.split.pad(self.partial(x)))

    def joining(self, local: nn.Module) -> nn.Module:
        return SequenceParallelRowProduct(local, self.communicator, self.split)


class SequenceParallelRowProduct(RowParallelProduct):
    """`SequenceParallelRowLinear` around this rank's partial product held in another form (`local`)."""

    def __init__(self, local: nn.Module, communicator: Collectives, split: SequenceSplit) -> None:
        super().__init__(local, communicator)
        self.split = split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.communicator.reduce_scatter(self.split.pad(self.partial(x)))


class SequenceParallelRMSNorm(RMSNorm):
    """An RMSNorm (and its fused residual add) on this rank's block of tokens; the normed rows of every
    token are all-gathered for the column-parallel product that reads them, the residual stays a block."""

    def __init__(self, hidden_size: int, eps: float, communicator: Collectives, split: SequenceSplit) -> None:
        super().__init__(hidden_size, eps)
        self.communicator = communicator
        self.split = split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.split.gather(super().forward(x), self.communicator)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed, total = super().add_and_norm(x, delta)
        return self.split.gather(normed, self.communicator), total
