"""What one rank of a split model holds, as the loader asks it: the whole model by default.

ember.parallel's modes (tensor, pipeline, expert parallel) subclass `ModelShard`; the loader, a floor
below them, reads any of them through this base without knowing the modes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ember.config.model import ModelConfig


@dataclass(frozen=True)
class TensorSlice:
    """Rows (dim 0) or columns (dim 1) [start, stop) of a checkpoint tensor."""

    dim: int
    start: int
    stop: int

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.narrow(self.dim, self.start, self.stop - self.start)



class ModelShard:
    """What one rank of a split model holds; the loader asks it, tensor by tensor (see ember.models.loader).

    The defaults are the whole model: every tensor held, whole, every layer's KV cache. A mode
    overrides what it splits: tensor parallel slices tensors, pipeline and expert parallel drop
    whole tensors (other stages' layers, other ranks' experts).
    """

    config: ModelConfig

    def local_config(self) -> ModelConfig:
        """The config this rank's model is built from."""
        return self.config

    def holds(self, name: str) -> bool:
        """Whether this rank loads checkpoint tensor `name` at all (never read otherwise)."""
        return True

    def slice_for(self, name: str) -> TensorSlice | None:
        """The part of checkpoint tensor `name` this rank loads (None: the whole tensor)."""
        return None

    @property
    def held_layers(self) -> range | None:
        """The layers whose KV cache this rank allocates (None: every layer)."""
        return None

    def shard_modules(self, model: nn.Module) -> None:
        """Swap in the layers that talk to the other ranks (the model is on the meta device)."""
