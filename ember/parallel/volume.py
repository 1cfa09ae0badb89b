"""How many bytes a tensor-parallel rank sends per token: the formulas the counted collectives must equal.

Per forward pass, tensor parallelism all-reduces a [tokens, hidden] activation twice per layer
(after the attention output projection and after the MLP down projection) and once after the
vocabulary-parallel embedding. Under a ring all-reduce each rank sends 2 (W - 1) / W of the
tensor, so per token and rank:

    all_reduce_bytes_per_token = (2 L + 1) * H * e * 2 (W - 1) / W

Scoring a sampled row gathers each worker's vocabulary slice on rank 0: ceil(V / W) * e bytes
per sampled token from every worker. The step's plan (token ids, positions, slot mapping,
block tables) is broadcast once per step: control traffic, counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.models.config import ModelConfig


@dataclass(frozen=True)
class TensorParallelVolume:
    """Predicted traffic of one rank for one model and world size."""

    all_reduces_per_forward: int
    all_reduce_bytes_per_token: float
    logits_gather_bytes_per_sampled_token: int  # sent by each worker rank, received by rank 0


def tensor_parallel_volume(config: ModelConfig, world_size: int, element_bytes: int) -> TensorParallelVolume:
    num_all_reduces = 2 * config.num_layers + 1
    ring_share = 2 * (world_size - 1) / world_size
    widest_vocab_slice = -(-config.vocab_size // world_size)
    return TensorParallelVolume(
        all_reduces_per_forward=num_all_reduces,
        all_reduce_bytes_per_token=num_all_reduces * config.hidden_size * element_bytes * ring_share,
        logits_gather_bytes_per_sampled_token=widest_vocab_slice * element_bytes,
    )
