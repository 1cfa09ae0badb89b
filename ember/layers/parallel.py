"""Tensor-parallel layers: each rank holds a slice of the weight and one collective joins the slices.

Column-parallel projections (fused QKV, gate-up) need no layer of their own: each rank builds
the plain `Linear` of its heads / its slice of the inner size, and its output stays local.
The layers here are the ones that talk to the other ranks:

- `RowParallelLinear` (attention output, MLP down): a partial product per rank, one all-reduce.
- `VocabParallelEmbedding`: each rank looks up the ids in its vocabulary slice, one all-reduce.
- `ParallelLMHead`: each rank scores its vocabulary slice; the slices are gathered on rank 0.

All products run on the packed CPU GEMM of the single-process `Linear` (ember.layers.cpu_gemm),
which sums each output over k in order, bias first. So a column slice, a vocabulary slice or a
head computes exactly the numbers the whole layer computes. Only the row-parallel all-reduce
differs: rank 0 sums bias + k in [0, K0) and rank 1 sums k in [K0, K) from zero, then the two
partial sums are added, where one process would have kept adding the second half onto the
first: one float32 rounding per output element per row-parallel layer.

A rank whose product is held in another form (GGML blocks, GPTQ groups: ember.quant) keeps the same
collectives: each layer here `joins` a local product module into a layer that runs them around it
(`JoinsSlices`), so a quantized rank runs the quantized kernels of one process on its slice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from ember.layers.collectives import Collectives
from ember.layers.embedding import VocabEmbedding
from ember.layers.linear import Linear
from ember.layers.weight_arena import WeightArena


@runtime_checkable
class JoinsSlices(Protocol):
    """A parallel layer whose collectives can run around a product held in another form (quantized blocks)."""

    def joining(self, local: nn.Module) -> nn.Module:
        """A layer that runs this layer's collectives around `local`, this rank's product of the same slice (a module
        with a `bias`, None or a tensor, of this layer's shape)."""


class RowParallelLinear(Linear):
    """y = sum over ranks of x_r @ W_r^T, + bias: each rank holds the input columns of its slice.

    The bias (loaded whole on every rank) is added by rank 0 only, before the all-reduce, so it
    counts once; the other ranks drop theirs when packing.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, communicator: Collectives) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.communicator = communicator

    def pack_weights(self, arena: WeightArena | None = None) -> bool:
        if self.bias is not None and not self.communicator.is_driver:
            self.bias = None  # rank 0 adds it; the kernel then starts every sum from zero
        return super().pack_weights(arena)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.communicator.all_reduce(self.partial(x))

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial product (with the bias on rank 0), before the ranks' sum."""
        if self.packed is not None:
            return super().forward(x)
        return F.linear(x, self.weight, self.bias if self.communicator.is_driver else None)

    def joining(self, local: nn.Module) -> nn.Module:
        return RowParallelProduct(local, self.communicator)


class RowParallelProduct(nn.Module):
    """`RowParallelLinear`'s all-reduce around this rank's partial product held in another form (`local`)."""

    def __init__(self, local: nn.Module, communicator: Collectives) -> None:
        super().__init__()
        if not communicator.is_driver:
            local.bias = None  # rank 0 adds it
        self.local = local
        self.communicator = communicator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.communicator.all_reduce(self.partial(x))

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial product (with the bias on rank 0), before the ranks' sum."""
        return self.local(x)


class GatheredRowLinear(Linear):
    """A row layer computed whole for this rank's slice of its outputs: one process's sums, bit for bit.

    The all-reduce of `RowParallelLinear` adds partial sums, which one process never does. Here
    the ranks all-gather their input columns (the heads or inner slice each computed) into the
    whole input, each multiplies it by the weight rows of its own output slice, summing every k
    in one process's order (bias first), and the output slices are all-gathered. The price is
    bytes: (W - 1) (K_r + H_r) elements per token instead of 2 (W - 1) / W H (K_r, H_r the
    widest input and output slices).
    """

    def __init__(self, input_sizes: list[int], output_sizes: list[int], bias: bool, communicator: Collectives) -> None:
        super().__init__(sum(input_sizes), output_sizes[communicator.rank], bias=bias)
        self.input_sizes = input_sizes
        self.output_sizes = output_sizes
        self.communicator = communicator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gathered_product(super().forward, x, self.input_sizes, self.output_sizes, self.communicator)

    def joining(self, local: nn.Module) -> nn.Module:
        return GatheredRowProduct(local, self.input_sizes, self.output_sizes, self.communicator)


class GatheredRowProduct(nn.Module):
    """`GatheredRowLinear`'s all-gathers around this rank's output rows held in another form (`local`)."""

    def __init__(self, local: nn.Module, input_sizes: list[int], output_sizes: list[int], communicator: Collectives) -> None:
        super().__init__()
        self.local = local
        self.input_sizes = input_sizes
        self.output_sizes = output_sizes
        self.communicator = communicator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _gathered_product(self.local, x, self.input_sizes, self.output_sizes, self.communicator)


def _gathered_product(product: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, input_sizes: list[int],
                      output_sizes: list[int], communicator: Collectives) -> torch.Tensor:
    """The whole input gathered, this rank's output columns computed, every rank's output columns gathered."""
    whole_input = _gather_columns(x, input_sizes, communicator)
    return _gather_columns(product(whole_input), output_sizes, communicator)


def _gather_columns(x: torch.Tensor, sizes: list[int], communicator: Collectives) -> torch.Tensor:
    """Every rank's columns of a [tokens, sizes[rank]] tensor, side by side in rank order (padded on the wire)."""
    widest = max(sizes)
    padded = F.pad(x, (0, widest - x.shape[1])) if x.shape[1] < widest else x
    blocks = communicator.all_gather(padded).chunk(len(sizes))
    return torch.cat([block[:, :size] for block, size in zip(blocks, sizes, strict=True)], dim=1)


class VocabParallelEmbedding(VocabEmbedding):
    """Rows [vocab_start, vocab_start + rows) of the embedding; ids outside the slice look up zeros.

    A tied head's panels serve the lookups, as for the whole table (one copy per rank).
    """

    def __init__(self, vocab_start: int, num_rows: int, hidden_size: int, communicator: Collectives) -> None:
        super().__init__(num_rows, hidden_size)
        self.vocab_start = vocab_start
        self.communicator = communicator

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.communicator.all_reduce(self.lookup(input_ids))

    def lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the ids in its slice, exact zeros elsewhere (the sum over ranks adds nothing else)."""
        return _slice_lookup(super().forward, input_ids, self.vocab_start, self.num_embeddings)

    def joining(self, local: nn.Module) -> nn.Module:
        return VocabParallelLookup(local, self.vocab_start, self.num_embeddings, self.communicator)


class VocabParallelLookup(nn.Module):
    """`VocabParallelEmbedding` over this rank's rows held in another form (`local`, an embedding of them)."""

    def __init__(self, local: nn.Module, vocab_start: int, num_rows: int, communicator: Collectives) -> None:
        super().__init__()
        self.local = local
        self.vocab_start = vocab_start
        self.num_rows = num_rows
        self.communicator = communicator

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.communicator.all_reduce(self.lookup(input_ids))

    def lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the ids in its slice, exact zeros elsewhere."""
        return _slice_lookup(self.local, input_ids, self.vocab_start, self.num_rows)


def _slice_lookup(rows_of: Callable[[torch.Tensor], torch.Tensor], input_ids: torch.Tensor, vocab_start: int, num_rows: int) -> torch.Tensor:
    """Rows of the ids in [vocab_start, vocab_start + num_rows) looked up by `rows_of` (local ids), exact zeros elsewhere."""
    local_ids = input_ids - vocab_start
    is_here = (local_ids >= 0) & (local_ids < num_rows)
    rows = rows_of(local_ids.clamp(0, num_rows - 1))
    return rows * is_here.unsqueeze(-1).to(rows.dtype)


class ParallelLMHead(Linear):
    """Scores of this rank's vocabulary slice; rank 0 gets the full [tokens, vocab] logits, others None.

    Slices may differ by one row (a vocabulary that does not divide); each rank pads its scores
    to the largest slice for the gather and rank 0 trims the padding.
    """

    def __init__(self, vocab_sizes: list[int], hidden_size: int, communicator: Collectives) -> None:
        super().__init__(hidden_size, vocab_sizes[communicator.rank], bias=False)
        self.vocab_sizes = vocab_sizes
        self.communicator = communicator

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return _gather_scores(super().forward(hidden), self.vocab_sizes, self.communicator)

    def joining(self, local: nn.Module) -> nn.Module:
        return ParallelHeadProduct(local, self.vocab_sizes, self.communicator)


class ParallelHeadProduct(nn.Module):
    """`ParallelLMHead` over this rank's vocabulary rows held in another form (`local`)."""

    def __init__(self, local: nn.Module, vocab_sizes: list[int], communicator: Collectives) -> None:
        super().__init__()
        self.local = local
        self.vocab_sizes = vocab_sizes
        self.communicator = communicator

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return _gather_scores(self.local(hidden), self.vocab_sizes, self.communicator)


def _gather_scores(scores: torch.Tensor, vocab_sizes: list[int], communicator: Collectives) -> torch.Tensor | None:
    """Every rank's vocabulary scores side by side on rank 0 (each padded to the widest slice on the wire); None elsewhere."""
    widest = max(vocab_sizes)
    if scores.shape[1] < widest:
        scores = F.pad(scores, (0, widest - scores.shape[1]))
    slices = communicator.gather_to_driver(scores.contiguous())
    if slices is None:
        return None
    return torch.cat([part[:, :size] for part, size in zip(slices, vocab_sizes, strict=True)], dim=1)
