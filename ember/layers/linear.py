"""Dense linear layers; the CPU decode fast path is chosen here, so model files never branch on it."""

from __future__ import annotations

import torch
from torch import nn

from ember.layers import cpu_gemv


class Linear(nn.Linear):
    """`nn.Linear` whose few-row float32 CPU products go through ember's compiled GEMV when available."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_gemv.can_use(x, self.weight):
            kernel = cpu_gemv.load_gemv()
            if kernel is not None:
                return kernel(x, self.weight, self.bias)
        return super().forward(x)
