"""Calibration statistics: what GPTQ, AWQ and SmoothQuant need to know about each linear layer's inputs.

The float model runs the calibration text through ember's own engine (prefill only); a
forward pre-hook on every linear to be quantized accumulates H = X^T X, sum |X| and max |X| per
input channel over the tokens it sees. Nothing else is stored, so memory is one [cols, cols]
matrix per layer whatever the amount of text (none without the Hessian: SmoothQuant needs only
the channel maxima).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn


class CalibrationRun(Protocol):
    """How quantization runs token sequences through the float model: ember's engine, driven from the floor above
    (ember.quantize), so quant itself never imports the engine. Every run is a prefill (one token is sampled)."""

    def prefill_each(self, chunks: list[list[int]], after_each: Callable[[], None]) -> None:
        """Each chunk prefilled on its own, in order; `after_each` called after each one."""

    def prefill_together(self, chunks: list[list[int]]) -> None:
        """Every chunk prefilled in one engine step (its token budget holds them all)."""

    def token_nll(self, request_id: str, token_ids: list[int]) -> list[float]:
        """The negative log-likelihood of every token after the first, each predicted from those before it."""


@dataclass
class InputStats:
    """Running sums over the inputs of one linear layer."""

    hessian: torch.Tensor | None  # None: not gathered
    abs_sum: torch.Tensor
    abs_max: torch.Tensor
    count: int = 0

    @classmethod
    def empty(cls, cols: int, with_hessian: bool = True) -> InputStats:
        hessian = torch.zeros(cols, cols, dtype=torch.float64) if with_hessian else None
        return cls(hessian, torch.zeros(cols, dtype=torch.float64), torch.zeros(cols, dtype=torch.float32))

    def add(self, x: torch.Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1])
        torch.maximum(self.abs_max, flat.abs().amax(0).float(), out=self.abs_max)
        flat = flat.double()
        if self.hessian is not None:
            self.hessian += flat.T @ flat
        self.abs_sum += flat.abs().sum(0)
        self.count += flat.shape[0]

    @property
    def mean_hessian(self) -> torch.Tensor:
        if self.hessian is None:
            raise ValueError("these input statistics were gathered without the Hessian (Calibration(with_hessian=False))")
        return (self.hessian / max(self.count, 1)).float()

    @property
    def mean_abs(self) -> torch.Tensor:
        return (self.abs_sum / max(self.count, 1)).float()


@dataclass
class Calibration:
    """Input statistics per linear layer name, filled while `run` feeds token chunks through the model."""

    stats: dict[str, InputStats] = field(default_factory=dict)
    with_hessian: bool = True  # GPTQ and AWQ read X^T X; SmoothQuant only the channel maxima

    def run(self, model: nn.Module, names: Iterable[str], feed: Callable[[], None]) -> None:
        """Hook the linears called `names` in `model`, call `feed()` (which runs the model), unhook."""
        handles = []
        for name in names:
            module = model.get_submodule(name)
            stats = self.stats.setdefault(name, InputStats.empty(module.in_features, self.with_hessian))
            handles.append(module.register_forward_pre_hook(lambda _module, args, stats=stats: stats.add(args[0])))
        try:
            feed()
        finally:
            for handle in handles:
                handle.remove()
