"""Triton kernels for CUDA tensors: paged attention, fused RMSNorm (+ residual add), rotary in place.

Tensors in, tensors out, the same layouts as the CPU ops beside them (ember.layers.cpu_*), so a layer
picks its kernel by its tensors' device and nothing above ember.layers knows which ran. Triton is an
optional dependency (the `gpu` extra): `load_triton_kernels()` is None without it. With
TRITON_INTERPRET=1 set before the first load the same kernels run on CPU tensors, slowly: that is how
`make test` checks them against their torch references on a machine without a GPU.
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

import torch


@functools.cache
def load_triton_kernels() -> ModuleType | None:
    """The kernels module (`ember.layers.triton_kernels.kernels`), imported once; None when triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        return None
    from ember.layers.triton_kernels import kernels

    return kernels


def kernels_for(tensor: torch.Tensor) -> ModuleType | None:
    """The dispatch point: the Triton kernels for a tensor on a CUDA device (None without triton), None for any other
    device, whose tensors keep their compiled C / torch path unchanged."""
    return load_triton_kernels() if tensor.device.type == "cuda" else None
