"""RMSNorm, computed in float32 whatever the weights' dtype."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.layers.cpu_elementwise import load_elementwise
from ember.layers.triton_kernels import kernels_for


class RMSNorm(nn.Module):
    """x / rms(x) * weight, as in Llama; one compiled call on float32 CPU activations, one Triton kernel on CUDA."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def divide_output_(self, scales: torch.Tensor) -> None:
        """Make the norm's output x / scales (per channel), in place: what AWQ and SmoothQuant fold into it."""
        with torch.no_grad():
            self.weight.div_(scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_kernels = kernels_for(x)
        if device_kernels is not None:
            return device_kernels.rms_norm(x, self.weight, self.eps)[0]
        ops = load_elementwise()
        # Contiguous first: the bits must not follow the layout (a Qwen3 rank's one key head per token is a strided
        # view, which would fall back to torch's rms_norm and round otherwise than the compiled op).
        fused = ops.rms_norm(x.contiguous(), self.weight, self.eps) if ops is not None else None
        return fused[0] if fused is not None else self.reference(x)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + delta), x + delta): a pre-norm block's residual add and the next norm in one pass."""
        device_kernels = kernels_for(x)
        if device_kernels is not None:
            return device_kernels.rms_norm(x, self.weight, self.eps, delta)
        ops = load_elementwise()
        fused = ops.rms_norm(x, self.weight, self.eps, delta) if ops is not None else None
        if fused is not None:
            return fused
        total = x + delta
        return self.reference(total), total

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The torch computation (the fallback, and what the compiled op is tested against)."""
        if x.dtype == torch.float32:
            # one fused kernel (float32 activations over bfloat16 weights: the weight cast, 1 row)
            return F.rms_norm(x, self.weight.shape, self.weight.to(x.dtype), self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)
