"""The compiled GGML kernels (ggml_source.c): dequantize rows of blocks, and few-row products.

Built on first use through ember.native_build with -march=native, so the instruction set is the
one of the CPU found at run time (AVX2 + FMA intrinsics where the compiler defines __AVX2__, a
portable C loop elsewhere). -ffp-contract=off keeps the dequantization bit-exact with the
`gguf` package; the products use explicit FMA intrinsics, which the flag does not touch.
Where no compiler exists, or with EMBER_PURE_TORCH=1, `load_kernels()` returns None and the
layers fall back to `dequantize_torch` + torch's matmul.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

from ember.quant.ggml_blocks import GGMLTensor

SOURCE_PATH = Path(__file__).with_name("ggml_source.c")
PURE_TORCH_ENV = "EMBER_PURE_TORCH"
MAX_GEMV_ROWS = 8  # the C kernel's MAX_M; more rows go through dequantized tiles and torch.mm


class GGMLKernels:
    """ctypes bindings of the compiled library."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._gemv = library.ember_ggml_gemv
        self._gemv.argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 3, ctypes.c_int]
        self._gemv.restype = ctypes.c_int
        self._dequantize = library.ember_ggml_dequantize
        self._dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self._dequantize.restype = None
        self.has_avx2 = bool(library.ember_ggml_has_avx2())

    def dequantize(self, weight: GGMLTensor) -> torch.Tensor:
        """float32 [rows, cols], bit-exact with the `gguf` package."""
        rows, cols = weight.shape
        out = torch.empty(rows, cols, dtype=torch.float32)
        self._dequantize(weight.format.type_id, weight.data.data_ptr(), out.data_ptr(), rows, cols)
        return out

    def gemv(self, x: torch.Tensor, weight: GGMLTensor, bias: torch.Tensor | None, portable: bool = False) -> torch.Tensor:
        """x [m, cols] float32 @ weight.T (+ bias) for 1 <= m <= MAX_GEMV_ROWS, accumulated in float32."""
        rows, cols = weight.shape
        x32 = x.float().contiguous()
        bias32 = None if bias is None else bias.float().contiguous()
        out = torch.empty(x.shape[0], rows, dtype=torch.float32)
        status = self._gemv(
            weight.format.type_id,
            x32.data_ptr(),
            weight.data.data_ptr(),
            None if bias32 is None else bias32.data_ptr(),
            out.data_ptr(),
            x.shape[0],
            rows,
            cols,
            int(portable),
        )
        if status != 0:
            raise ValueError(f"the GGML GEMV takes 1 to {MAX_GEMV_ROWS} rows, got {x.shape[0]} (status {status})")
        return out


@functools.cache
def load_kernels() -> GGMLKernels | None:
    """The kernels, built and loaded once per process; None when unavailable."""
    if os.environ.get(PURE_TORCH_ENV):
        return None
    from ember.native_build import build_shared_library

    flags = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off")
    path = build_shared_library("ember_ggml", SOURCE_PATH.read_text(), flags)
    if path is None:
        return None
    try:
        return GGMLKernels(ctypes.CDLL(str(path)))
    except OSError:
        return None
