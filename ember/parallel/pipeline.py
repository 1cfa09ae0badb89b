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

from torch import nn

from ember.config.model import ModelConfig
from ember.layers.pipeline import PipelineStage
from ember.models.decoder import DecoderModel
from ember.models.shard import ModelShard
from ember.parallel.communicator import Communicator
from ember.parallel.stage_split import stage_spans

_LAYER_NAME = re.compile(r"^model\.layers\.(\d+)\.")
_FIRST_STAGE = ("model.embed_tokens.", "lm_head.")
_LAST_STAGE = ("model.norm.",)


@dataclass(frozen=True)
class PipelineShard(ModelShard):
    """Stage `rank` of `world_size` over `config`'s layers."""

    config: ModelConfig
    rank: int
    world_size: int
    communicator: Communicator | None = field(default=None, compare=False)

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
