"""The W8A8 linear layer (SmoothQuant's): int8 weights per output channel, int8 activations per token.

`y = x W^T + b` with W as `Int8ChannelTensor` codes and scales (non-persistent buffers: state
dicts never carry them). Each call rounds every token row of x to int8 with a scale of its own,
sums code products exactly in integers and scales once (ember.quant.int8.channel states the
arithmetic). Every shape goes through the compiled kernel, which streams the int8 weight once
per 8 token rows: on this project's AVX2 machine (`ember bench quant`'s W8A8 table, SmolLM2's
shapes) it beat `torch._int_mm` 4-70x from 1 to 256 rows, and the plain-torch path (float32 GEMM
on the codes) 2-20x up to 16 rows; at 64 rows the two were within noise (0.8-1.2x).
With EMBER_PURE_TORCH=1 or no compiler, the plain-torch path (exact float32 sums of codes in
chunks) takes every shape; both give the same bits, so a token's result does not depend on the path.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from ember.layers.cpu_gemm import CompiledProduct
from ember.quant.int8.channel import Int8ChannelTensor, w8a8_linear_torch
from ember.quant.int8.w8a8_kernels import W8A8WeightPointer, load_w8a8_kernels


class W8A8Linear(nn.Module):
    """`y = x W^T + b`, W int8 per output channel, x rounded to int8 per token on every call."""

    def __init__(self, weight: Int8ChannelTensor, bias: nn.Parameter | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("codes", weight.codes, persistent=False)
        self.register_buffer("scales", weight.scales, persistent=False)
        self.bias = bias

    @property
    def weight_tensor(self) -> Int8ChannelTensor:
        return Int8ChannelTensor(self.codes, self.scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        kernels = load_w8a8_kernels()
        bias = None if self.bias is None else self.bias.float()
        if kernels is not None:
            out = kernels.linear(flat, self.weight_tensor, bias)
        else:
            out = w8a8_linear_torch(flat.contiguous(), self.weight_tensor, bias)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def compiled_product(self) -> CompiledProduct | None:
        """This layer's product for the compiled decoder layer (same bits as `forward`); None without the kernel."""
        kernels = load_w8a8_kernels()
        if kernels is None:
            return None
        weight = W8A8WeightPointer(self.codes.data_ptr(), self.scales.data_ptr())
        bias = None if self.bias is None else self.bias.detach().float().contiguous()
        return CompiledProduct(kernels.linear_address, ctypes.addressof(weight), None if bias is None else bias.data_ptr(),
                               self.in_features, None, (weight, bias, self.codes, self.scales))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format=W8A8, bias={self.bias is not None}"
