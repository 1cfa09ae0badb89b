"""Which slice each rank holds: whole KV groups per rank, replication below one KV head per rank."""

from __future__ import annotations

import pytest

from ember.config.model import ModelConfig
from ember.parallel.sharding import (
    Span,
    TensorParallelShard,
    TensorSlice,
    balanced_spans,
    head_spans,
)


def _config(num_heads: int, num_kv_heads: int, architecture: str = "llama") -> ModelConfig:
    return ModelConfig(
        architecture=architecture, vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=2,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=64, max_position_embeddings=128,
    )  # fmt: skip


def test_balanced_spans_give_the_remainder_to_the_first_ranks():
    assert balanced_spans(321, 2) == [Span(0, 161), Span(161, 321)]
    assert balanced_spans(8, 4) == [Span(0, 2), Span(2, 4), Span(4, 6), Span(6, 8)]


def test_smollm2_three_kv_heads_split_as_whole_groups_over_two_ranks():
    assert head_spans(9, 3, 2) == [(Span(0, 6), Span(0, 2)), (Span(6, 9), Span(2, 3))]


def test_fewer_kv_heads_than_ranks_replicates_the_kv_head_each_rank_reads():
    assert head_spans(8, 1, 2) == [(Span(0, 4), Span(0, 1)), (Span(4, 8), Span(0, 1))]
    assert head_spans(8, 2, 4) == [(Span(0, 2), Span(0, 1)), (Span(2, 4), Span(0, 1)), (Span(4, 6), Span(1, 2)), (Span(6, 8), Span(1, 2))]


def test_heads_that_cannot_split_name_the_fix():
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        head_spans(6, 2, 4)


def test_rank_one_of_smollm2_loads_its_rows_and_columns():
    shard = TensorParallelShard(_config(9, 3), rank=1, world_size=2)
    assert shard.slice_for("model.layers.0.self_attn.q_proj.weight") == TensorSlice(0, 384, 576)
    assert shard.slice_for("model.layers.0.self_attn.k_proj.weight") == TensorSlice(0, 128, 192)
    assert shard.slice_for("model.layers.0.self_attn.o_proj.weight") == TensorSlice(1, 384, 576)
    assert shard.slice_for("model.layers.0.mlp.up_proj.weight") == TensorSlice(0, 768, 1536)
    assert shard.slice_for("model.layers.0.mlp.down_proj.weight") == TensorSlice(1, 768, 1536)
    assert shard.slice_for("model.layers.0.mlp.down_proj.bias") is None  # added once, by rank 0
    assert shard.slice_for("model.embed_tokens.weight") == TensorSlice(0, 24576, 49152)
    assert shard.slice_for("model.layers.0.input_layernorm.weight") is None
    local = shard.local_config()
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (3, 1, 768)


def test_families_without_tensor_parallel_layers_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        TensorParallelShard(_config(8, 8, architecture="gpt2"), rank=0, world_size=2)
