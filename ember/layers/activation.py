"""Activations of feed-forward blocks by their transformers names (`hidden_act`), plain and gated.

A gated block computes act(gate) * up over rows [gate | up]; SwiGLU (silu) has a compiled kernel,
the others run in torch. A name ember does not know is refused where the model is built, never
replaced by another activation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ember.layers.cpu_elementwise import load_elementwise

Activation = Callable[[torch.Tensor], torch.Tensor]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _relu_squared(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


# transformers' ACT2FN names ember runs (gelu_new, gelu_fast and gelu_pytorch_tanh are one formula).
ACTIVATIONS: dict[str, Activation] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "quick_gelu": _quick_gelu,
    "relu": F.relu,
    "relu2": _relu_squared,
    "tanh": torch.tanh,
}
SILU_NAMES = ("silu", "swish")


def activation(name: str, model: str) -> Activation:
    """The activation transformers calls `name`; ValueError naming `model` and the supported names otherwise."""
    if name not in ACTIVATIONS:
        raise ValueError(f"{model} activation {name!r} is not supported; ember runs {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def gated_activation(name: str, model: str) -> Activation:
    """act(gate) * up over rows [gate | up] ([..., 2 * inner] -> [..., inner]) for the activation called `name`."""
    if name in SILU_NAMES:
        return silu_and_mul
    act = activation(name, model)

    def gated(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return act(gate) * up

    return gated


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
