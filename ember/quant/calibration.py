"""Calibration statistics: what GPTQ and AWQ need to know about each linear layer's inputs.

The float model runs the calibration text through ember's own engine (prefill only); a
forward pre-hook on every linear to be quantized accumulates H = X^T X and sum |X| over the
tokens it sees. Nothing else is stored, so memory is one [cols, cols] matrix per layer
whatever the amount of text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class InputStats:
    """Running sums over the inputs of one linear layer."""

    hessian: torch.Tensor
    abs_sum: torch.Tensor
    count: int = 0

    @classmethod
    def empty(cls, cols: int) -> InputStats:
        return cls(torch.zeros(cols, cols, dtype=torch.float64), torch.zeros(cols, dtype=torch.float64))

    def add(self, x: torch.Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1]).double()
        self.hessian += flat.T @ flat
        self.abs_sum += flat.abs().sum(0)
        self.count += flat.shape[0]

    @property
    def mean_hessian(self) -> torch.Tensor:
        return (self.hessian / max(self.count, 1)).float()

    @property
    def mean_abs(self) -> torch.Tensor:
        return (self.abs_sum / max(self.count, 1)).float()


@dataclass
class Calibration:
    """Input statistics per linear layer name, filled while `run` feeds token chunks through the model."""

    stats: dict[str, InputStats] = field(default_factory=dict)

    def run(self, model: nn.Module, names: Iterable[str], feed: Callable[[], None]) -> None:
        """Hook the linears called `names` in `model`, call `feed()` (which runs the model), unhook."""
        handles = []
        for name in names:
            module = model.get_submodule(name)
            stats = self.stats.setdefault(name, InputStats.empty(module.in_features))
            handles.append(module.register_forward_pre_hook(lambda _module, args, stats=stats: stats.add(args[0])))
        try:
            feed()
        finally:
            for handle in handles:
                handle.remove()
