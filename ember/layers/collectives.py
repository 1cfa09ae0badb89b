"""What a parallel layer asks of its process group: the collectives between the ranks that share a layer.

Declared here, below ember.parallel, so the layers (tensor-, sequence-, expert- and pipeline-parallel)
import nothing from it; ember.parallel.communicator.Communicator implements it over gloo or shared memory.
"""

from __future__ import annotations

from typing import Protocol

import torch


class PointToPoint(Protocol):
    """Sends between numbered peers (pipeline stages: `rank` of `world_size`)."""

    rank: int
    world_size: int

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        """Send `tensor` to peer `peer`."""

    def receive(self, shape: tuple[int, ...], dtype: torch.dtype, peer: int) -> torch.Tensor:
        """The tensor peer `peer` sends next (of this shape and dtype)."""


class Collectives(PointToPoint, Protocol):
    """One rank's collectives with its peers; rank 0 is the driver (the engine process)."""

    @property
    def is_driver(self) -> bool: ...

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks, in place; returns it."""

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the ranks and keep row block `rank` of W equal blocks."""

    def all_gather(self, block: torch.Tensor) -> torch.Tensor:
        """Every rank's `block` stacked along rows, in rank order."""

    def gather_to_driver(self, tensor: torch.Tensor, timeout_s: float | None = None) -> list[torch.Tensor] | None:
        """Every rank's `tensor` on rank 0, in rank order; None elsewhere."""
