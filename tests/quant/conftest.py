"""Fixtures shared by the quantization tests."""

from __future__ import annotations

import pytest

from ember.quant.ggml.kernels import GGMLKernels, load_kernels


@pytest.fixture(scope="session")
def int8_kernels() -> GGMLKernels:
    """The compiled GGML kernels with their int8 path; the test skips where this machine has none."""
    loaded = load_kernels()
    if loaded is None or "int8" not in loaded.paths:
        pytest.skip("no compiled int8 path here (no C compiler, no AVX2, or EMBER_PURE_TORCH is set)")
    return loaded
