"""Gated activations of feed-forward blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ember.layers.cpu_elementwise import load_elementwise


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's silu(gate) * up over rows [gate | up] ([..., 2 * inner] -> [..., inner]).

    One compiled call on float32 CPU rows; torch (the reference) otherwise.
    """
    ops = load_elementwise()
    fused = ops.silu_mul(gate_up) if ops is not None else None
    if fused is not None:
        return fused
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
