"""Which routed experts an expert-parallel rank holds: contiguous ranges of expert ids, as even as they go.

Everything that is not a routed expert (attention, router, shared experts, dense layers,
embedding, head) is replicated on every rank; each MoE block becomes an `ExpertParallelMoE`
holding only this rank's experts, and only their tensors are read from the checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch import nn

from ember.config.model import ModelConfig
from ember.layers.expert_parallel import ExpertParallelMoE
from ember.layers.moe import SparseMoE
from ember.models.shard import ModelShard
from ember.parallel.communicator import Communicator
from ember.parallel.sharding import balanced_spans

_EXPERT_NAME = re.compile(r"\.experts\.(\d+)\.")


@dataclass(frozen=True)
class ExpertParallelShard(ModelShard):
    """Rank `rank` of `world_size`: experts `held_experts` of every MoE block."""

    config: ModelConfig
    rank: int
    world_size: int
    communicator: Communicator | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.config.moe is None:
            raise ValueError(
                f"--enable-expert-parallel splits the experts of MoE models; {self.config.architecture!r} has none "
                "(drop the flag to split it with tensor parallelism)"
            )
        if self.config.moe.num_experts < self.world_size:
            raise ValueError(f"{self.config.moe.num_experts} experts cannot be split over {self.world_size} ranks; use fewer")

    @property
    def rank_experts(self) -> list[range]:
        """The experts each rank holds, in rank order."""
        assert self.config.moe is not None
        return [range(span.start, span.stop) for span in balanced_spans(self.config.moe.num_experts, self.world_size)]

    @property
    def held_experts(self) -> range:
        return self.rank_experts[self.rank]

    def holds(self, name: str) -> bool:
        expert = _EXPERT_NAME.search(name)
        return expert is None or int(expert.group(1)) in self.held_experts

    def shard_modules(self, model: nn.Module) -> None:
        if self.communicator is None:
            raise ValueError("shard_modules needs the rank's communicator; build the shard with one")
        blocks = [(name, module) for name, module in model.named_modules() if type(module) is SparseMoE]
        if not blocks:
            raise ValueError(f"{self.config.architecture!r} has no ember SparseMoE block to split: drop --enable-expert-parallel")
        for name, moe in blocks:
            parallel = ExpertParallelMoE(
                moe.gate.in_features, moe.config, type(moe.experts[0]), moe.shared_name or "shared_expert",
                self.rank_experts, self.communicator,
            )  # fmt: skip
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, parallel)
