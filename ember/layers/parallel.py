"""Tensor-parallel layers: each rank holds a slice of the weight and one collective joins the slices.

Column-parallel projections (fused QKV, gate-up) need no layer of their own: each rank builds
the plain `Linear` of its heads / its slice of the inner size, and its output stays local.
The layers here are the ones that talk to the other ranks:

- `RowParallelLinear` (attention output, MLP down): a partial product per rank, one all-reduce.
- `VocabParallelEmbedding`: each rank looks up the ids in its vocabulary slice, one all-reduce.
- `ParallelLMHead`: each rank scores its vocabulary slice; the slices are gathered on rank 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.parallel.communicator import Communicator


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # TODO(kernels): pack these shards for ember.layers.cpu_gemm as Linear does (the few-row GEMV is gone)
    return F.linear(x, weight, bias)


class RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r @ W_r^T, + bias: each rank holds the input columns of its slice.

    The bias (whole on every rank) is added by rank 0 only, before the all-reduce, so it
    counts once.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, communicator: Communicator) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.communicator = communicator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.communicator.is_driver else None
        return self.communicator.all_reduce(_linear(x, self.weight, bias))


class VocabParallelEmbedding(nn.Module):
    """Rows [vocab_start, vocab_start + rows) of the embedding; ids outside the slice look up zeros."""

    def __init__(self, vocab_start: int, num_rows: int, hidden_size: int, communicator: Communicator) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_rows, hidden_size))
        self.vocab_start = vocab_start
        self.communicator = communicator

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local_ids = input_ids - self.vocab_start
        is_here = (local_ids >= 0) & (local_ids < self.weight.shape[0])
        rows = F.embedding(local_ids.clamp(0, self.weight.shape[0] - 1), self.weight)
        rows = rows * is_here.unsqueeze(-1).to(rows.dtype)  # exact zeros: the sum adds nothing else
        return self.communicator.all_reduce(rows)


class ParallelLMHead(nn.Module):
    """Scores of this rank's vocabulary slice; rank 0 gets the full [tokens, vocab] logits, others None.

    Slices may differ by one row (a vocabulary that does not divide); each rank pads its scores
    to the largest slice for the gather and rank 0 trims the padding.
    """

    def __init__(self, vocab_sizes: list[int], hidden_size: int, communicator: Communicator) -> None:
        super().__init__()
        self.vocab_sizes = vocab_sizes
        self.weight = nn.Parameter(torch.empty(vocab_sizes[communicator.rank], hidden_size))
        self.communicator = communicator

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        scores = _linear(hidden, self.weight, None)
        widest = max(self.vocab_sizes)
        if scores.shape[1] < widest:
            scores = F.pad(scores, (0, widest - scores.shape[1]))
        slices = self.communicator.gather_to_driver(scores)
        if slices is None:
            return None
        return torch.cat([part[:, :size] for part, size in zip(slices, self.vocab_sizes, strict=True)], dim=1)
