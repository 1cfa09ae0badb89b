"""What rank 0 broadcasts to the worker ranks: plain dataclasses of tensors and lists, pickled by the communicator."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ember.kv.cache_manager import BlockCopy
from ember.layers.attention import AttentionMetadata


@dataclass(frozen=True)
class AllocateKVCache:
    """Allocate this rank's shard of the KV cache: the same block count on every rank."""

    num_blocks: int
    block_size: int
    dtype: torch.dtype


@dataclass(frozen=True)
class RunForward:
    """One step's plan: copy these blocks, then run the forward pass on these tokens."""

    block_copies: list[BlockCopy]
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata


@dataclass(frozen=True)
class ComputeLogits:
    """Score these final hidden rows with this rank's vocabulary slice (gathered on rank 0)."""

    hidden: torch.Tensor


@dataclass(frozen=True)
class StopWorker:
    """Leave the loop and exit."""


WorkerCommand = AllocateKVCache | RunForward | ComputeLogits | StopWorker
