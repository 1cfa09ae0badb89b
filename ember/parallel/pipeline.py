"""Which layers a pipeline stage holds: contiguous ranges balanced by weight (ember.parallel.stage_split).

Stage 0 (rank 0, the engine) also holds the embedding and the LM head (one copy of a tied table,
and the logits stay where the sampler runs), so it takes fewer layers; the last stage holds the
final norm. A stage reads only its tensors from the checkpoint and allocates KV cache only for its
layers.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.layers.collectives import PointToPoint
from ember.layers.pipeline import PipelineStage
from ember.models.decoder import DecoderModel
from ember.models.shard import ModelShard, TensorSlice
from ember.parallel.communicator import Communicator
from ember.parallel.sharding import TensorParallelShard
from ember.parallel.stage_split import stage_spans

_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.")
_FIRST_STAGE = ("model.embed_tokens.", "lm_head.")
_LAST_STAGE = ("model.norm.",)


@dataclass(frozen=True)
class PipelineShard(ModelShard):
    """Stage `rank` of `world_size` over `config`'s layers; `communicator` numbers the stages."""

    config: ModelConfig
    rank: int
    world_size: int
    communicator: PointToPoint | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.config.num_layers < self.world_size:
            raise ValueError(
                f"{self.config.num_layers} layers cannot fill {self.world_size} pipeline stages; "
                "use a --pipeline-parallel-size of at most the number of layers"
            )

    @functools.cached_property
    def held_layers(self) -> range:
        span = stage_spans(self.config, self.world_size)[self.rank]
        return range(span.start, span.stop)

    def holds(self, name: str) -> bool:
        layer = _LAYER_NAME.match(name)
        if layer is not None:
            return int(layer.group(1)) in self.held_layers
        if name.startswith(_FIRST_STAGE):
            return self.rank == 0
        if name.startswith(_LAST_STAGE):
            return self.rank == self.world_size - 1
        return True

    def shard_modules(self, model: nn.Module) -> None:
        if self.communicator is None:
            raise ValueError("shard_modules needs the rank's communicator; build the shard with one")
        if type(model.model) is not DecoderModel:
            raise ValueError(
                f"pipeline parallelism runs families built on ember's DecoderModel; {self.config.architecture!r} "
                "is not one: run it with --pipeline-parallel-size 1"
            )
        model.model = PipelineStage(model.model, self.held_layers, self.communicator)
        if self.rank != 0:
            model.lm_head = nn.Module()  # rank 0 scores the final hidden states


@dataclass(frozen=True)
class StagePipe:
    """Sends between pipeline stages numbered 0..P-1, over the world's communicator, for one tensor rank: stage s's
    rank of tensor rank t is world rank s * T + t (ParallelConfig.stage_of), so each rank talks to its own peers."""

    world: Communicator
    rank: int  # this stage
    world_size: int  # stages
    tensor_rank: int
    tensor_parallel_size: int

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        self.world.send(tensor, self._world_rank(peer))

    def receive(self, shape: tuple[int, ...], dtype: torch.dtype, peer: int) -> torch.Tensor:
        return self.world.receive(shape, dtype, self._world_rank(peer))

    def _world_rank(self, stage: int) -> int:
        return stage * self.tensor_parallel_size + self.tensor_rank


@dataclass(frozen=True)
class TensorPipelineShard(ModelShard):
    """A rank of T x P: its stage's layers (`stage`), and of those its tensor-parallel slices (`tensor`).

    Every stage's tensor-parallel group holds heads, inner size and (first stage) vocabulary split as TP alone does;
    the hidden states between stages are whole on every rank of a group (the row layers sum them), so each rank
    sends its copy to its peer in the next stage."""

    tensor: TensorParallelShard
    stage: PipelineShard

    @property
    def config(self) -> ModelConfig:
        return self.tensor.config

    def local_config(self) -> ModelConfig:
        return self.tensor.local_config()

    def holds(self, name: str) -> bool:
        return self.stage.holds(name)

    def slice_for(self, name: str) -> TensorSlice | None:
        return self.tensor.slice_for(name)

    @property
    def held_layers(self) -> range:
        return self.stage.held_layers

    def shard_modules(self, model: nn.Module) -> None:
        self.tensor.shard_modules(model)
        self.stage.shard_modules(model)
