"""Triton kernels run in interpreter mode on a machine without CUDA.

TRITON_INTERPRET must be in the environment before the first kernel is decorated (when
ember.layers.triton_kernels.kernels is imported), so it is set here, at collection, and only where no
GPU exists: on a CUDA machine the same tests compile the kernels and run them on the GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def kernel_device() -> torch.device:
    """Where the Triton kernel tests put their tensors: the GPU when there is one, else the CPU (interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
