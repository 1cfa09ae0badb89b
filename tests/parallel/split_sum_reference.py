"""A one-process reference for tensor parallelism's only reordered sums: row-parallel partial products.

With every product on the packed GEMM (each output summed over k in order), a TP=2 rank
computes exactly what the whole layer computes, except in the row-parallel layers (attention
output, MLP down): there rank 0 sums bias + k in its slice, rank 1 sums k in its slice from
zero, and the all-reduce adds the two. `split_row_parallel_sums` rebuilds a single-process
model's row layers to add the same partial sums in the same order, so a TP=2 engine must match
it bit for bit: whatever differs from the plain single process is then that one addition.
"""

from __future__ import annotations

import torch
from torch import nn

from ember.layers.cpu_gemm import PackedWeight, load_gemm
from ember.parallel.sharding import Span, TensorParallelShard


class SplitSumLinear(nn.Module):
    """A packed linear whose k range is summed as separate partial products, added in rank order."""

    def __init__(self, linear: nn.Module, spans: list[Span]) -> None:
        super().__init__()
        dense = linear.packed.dense()
        bias = None if linear.packed.bias is None else linear.packed.bias[: linear.packed.out_features]
        self.spans = spans
        self.parts = [
            PackedWeight.from_dense(dense[:, span.start : span.stop].contiguous(), bias if rank == 0 else None)
            for rank, span in enumerate(spans)
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gemm = load_gemm()
        partials = [gemm(x[:, span.start : span.stop].contiguous(), part) for span, part in zip(self.spans, self.parts, strict=True)]
        total = partials[0]
        for partial in partials[1:]:
            total = total + partial
        return total


def split_row_parallel_sums(model: nn.Module, world_size: int) -> None:
    """Rebuild `model`'s (a packed single-process Llama-family model) row layers as TP's partial sums."""
    config = model.config
    shards = [TensorParallelShard(config, rank, world_size) for rank in range(world_size)]
    for layer in model.model.layers:
        layer.self_attn.o_proj = SplitSumLinear(layer.self_attn.o_proj, [s.query_heads.scaled(config.head_dim) for s in shards])
        layer.mlp.down_proj = SplitSumLinear(layer.mlp.down_proj, [s.inner for s in shards])
        layer.drop_compiled()  # the compiled layer would go on reading the whole products it was built from
