"""A one-process reference for tensor parallelism's only reordered sums: row-parallel partial products.

With every product on the packed GEMM (each output summed over k in order), a TP=2 rank
computes exactly what the whole layer computes, except in the row-parallel layers (attention
output, MLP down): there rank 0 sums bias + k in its slice, rank 1 sums k in its slice from
zero, and the all-reduce adds the two. `split_row_parallel_sums` rebuilds a single-process
model's row layers to add the same partial sums in the same order, so a TP=2 engine must match
it bit for bit: whatever differs from the plain single process is then that one addition.
Quantized row layers (GGML blocks, GPTQ groups) split the same way: each partial product is the
layer of its columns' blocks (ember.quant.parts), as a quantized rank holds them.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ember.layers.cpu_gemm import PackedWeight, load_gemm
from ember.parallel.sharding import Span, TensorParallelShard
from ember.quant.ggml.layers import GGMLLinear, ZeroPointLinear
from ember.quant.ggml.zero_point import ZeroPointTensor
from ember.quant.parts import quantized_part


class SplitSumLinear(nn.Module):
    """A packed (or quantized) linear whose k range is summed as separate partial products, added in rank order."""

    def __init__(self, linear: nn.Module, spans: list[Span]) -> None:
        super().__init__()
        self.spans = spans
        if isinstance(linear, GGMLLinear):
            self.parts = [_quantized_columns(linear, span, rank == 0) for rank, span in enumerate(spans)]
            return
        dense = linear.packed.dense()
        bias = None if linear.packed.bias is None else linear.packed.bias[: linear.packed.out_features]
        gemm = load_gemm()
        self.parts = [
            functools.partial(gemm, weight=PackedWeight.from_dense(dense[:, span.start : span.stop].contiguous(), bias if rank == 0 else None))
            for rank, span in enumerate(spans)
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partials = [part(x[:, span.start : span.stop].contiguous()) for span, part in zip(self.spans, self.parts, strict=True)]
        total = partials[0]
        for partial in partials[1:]:
            total = total + partial
        return total


def _quantized_columns(linear: GGMLLinear, span: Span, has_bias: bool) -> GGMLLinear:
    """The layer of `linear`'s input columns `span`, in its own blocks (with the bias on rank 0 only)."""
    weight = linear.weight_tensor if isinstance(linear, ZeroPointLinear) else linear.weight_blocks
    part = quantized_part(weight, 1, span.start, span.stop, "reference")
    bias = linear.bias if has_bias else None
    if isinstance(part, ZeroPointTensor):
        return ZeroPointLinear(part, bias, linear.activations)
    return GGMLLinear(part, bias, linear.activations)


def split_row_parallel_sums(model: nn.Module, world_size: int) -> None:
    """Rebuild `model`'s (a packed single-process Llama-family model) row layers as TP's partial sums."""
    config = model.config
    shards = [TensorParallelShard(config, rank, world_size) for rank in range(world_size)]
    for layer in model.model.layers:
        layer.self_attn.o_proj = SplitSumLinear(layer.self_attn.o_proj, [s.query_heads.scaled(config.head_dim) for s in shards])
        layer.mlp.down_proj = SplitSumLinear(layer.mlp.down_proj, [s.inner for s in shards])
        layer.drop_compiled()  # the compiled layer would go on reading the whole products it was built from
