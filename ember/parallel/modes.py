"""From a parallel config and a rank's communicator to what that rank holds of a model (its `ModelShard`)."""

from __future__ import annotations

from collections.abc import Callable

from ember.config.model import ModelConfig
from ember.models.shard import ModelShard
from ember.parallel.communicator import Communicator
from ember.parallel.config import ParallelConfig
from ember.parallel.expert import ExpertParallelShard
from ember.parallel.group import subgroup
from ember.parallel.pipeline import PipelineShard, StagePipe, TensorPipelineShard
from ember.parallel.sharding import TensorParallelShard

_SHARDS = {"tensor": TensorParallelShard, "pipeline": PipelineShard, "expert": ExpertParallelShard}


def shard_factory(communicator: Communicator, parallel: ParallelConfig) -> Callable[[ModelConfig], ModelShard]:
    """The loader's hook: the whole model's config -> this rank's shard under `parallel`'s mode.

    T x P: this rank's stage's tensor-parallel group is formed here (every rank calls this as it starts loading)."""
    if parallel.mode == "tensor-pipeline":
        return _tensor_pipeline_factory(communicator, parallel)
    if parallel.mode not in _SHARDS:
        raise ValueError("a single-process engine has no shards: load the model without shard_for")
    shard_class = _SHARDS[parallel.mode]

    def shard_for(config: ModelConfig) -> ModelShard:
        if parallel.mode == "tensor":
            return TensorParallelShard(
                config, communicator.rank, communicator.world_size, communicator,
                is_sequence_parallel=parallel.enable_sequence_parallel, is_exact_row_parallel=parallel.exact_row_parallel,
            )  # fmt: skip
        return shard_class(config, communicator.rank, communicator.world_size, communicator)

    return shard_for


def _tensor_pipeline_factory(world: Communicator, parallel: ParallelConfig) -> Callable[[ModelConfig], ModelShard]:
    stage, tensor_rank = parallel.stage_of(world.rank)
    size = parallel.tensor_parallel_size
    tensor_group = subgroup(world, range(stage * size, (stage + 1) * size), parallel.startup_timeout_s)
    pipe = StagePipe(world, stage, parallel.pipeline_parallel_size, tensor_rank, size)

    def shard_for(config: ModelConfig) -> ModelShard:
        tensor = TensorParallelShard(config, tensor_rank, size, tensor_group, is_exact_row_parallel=parallel.exact_row_parallel)
        return TensorPipelineShard(tensor, PipelineShard(config, stage, parallel.pipeline_parallel_size, pipe))

    return shard_for
