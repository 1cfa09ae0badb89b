"""The compiled W8A8 kernel (w8a8_source.c): per-token int8 activations times per-channel int8 weights.

Built on first use through ember.native_build with -march=native and -ffp-contract=off (AVX2
maddubs/madd integer sums where the compiler defines __AVX2__, a portable loop elsewhere), so its
output is bit for bit the plain-torch reference's (ember.quant.int8.channel). Where no compiler
exists, or with EMBER_PURE_TORCH=1, `load_w8a8_kernels()` returns None and the layer runs the
plain-torch product.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ember.native_build import EXACT_CPU_KERNEL_FLAGS, load_cpu_kernels
from ember.quant.int8.channel import Int8ChannelTensor

SOURCE_PATH = Path(__file__).with_name("w8a8_source.c")
KERNEL_ROWS = 8  # MAX_M in the C source: token rows per pass over the weight


class W8A8WeightPointer(ctypes.Structure):
    """w8a8_source.c's `w8a8_weight`: what `ember_w8a8_linear` (a gemm_fn) takes as its weight pointer."""

    _fields_ = [("codes", ctypes.c_void_p), ("scales", ctypes.c_void_p)]

    @classmethod
    def of(cls, weight: Int8ChannelTensor) -> W8A8WeightPointer:
        return cls(weight.codes.data_ptr(), weight.scales.data_ptr())


class W8A8Kernels:
    """ctypes bindings of the compiled library."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.linear_address = ctypes.cast(library.ember_w8a8_linear, ctypes.c_void_p).value
        self._linear = library.ember_w8a8_linear
        self._linear.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, *[ctypes.c_int64] * 3]
        self._linear.restype = None
        self._int_products = library.ember_w8a8_int_products
        self._int_products.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3
        self._int_products.restype = None
        self.has_avx2 = bool(library.ember_w8a8_has_avx2())

    def linear(self, x: torch.Tensor, weight: Int8ChannelTensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [m, cols] float32 -> [m, rows] float32, the same bits as `w8a8_linear_torch`."""
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
            bias = bias.float().contiguous()
        rows, cols = weight.shape
        out = torch.empty(x.shape[0], rows, dtype=torch.float32)
        pointer = W8A8WeightPointer.of(weight)
        self._linear(x.data_ptr(), ctypes.addressof(pointer), None if bias is None else bias.data_ptr(), out.data_ptr(),
                     x.shape[0], rows, cols)
        return out

    def int_products(self, x_codes: torch.Tensor, w_codes: torch.Tensor) -> torch.Tensor:
        """int32 [m, rows] = x_codes [m, cols] . w_codes [rows, cols]^T (int8, contiguous)."""
        x_codes, w_codes = x_codes.contiguous(), w_codes.contiguous()
        out = torch.empty(x_codes.shape[0], w_codes.shape[0], dtype=torch.int32)
        self._int_products(x_codes.data_ptr(), w_codes.data_ptr(), out.data_ptr(), x_codes.shape[0], w_codes.shape[0], x_codes.shape[1])
        return out


@functools.cache
def load_w8a8_kernels() -> W8A8Kernels | None:
    """The kernels, built and loaded once per process; None when unavailable or turned off."""
    library = load_cpu_kernels("ember_w8a8", SOURCE_PATH, EXACT_CPU_KERNEL_FLAGS)
    return None if library is None else W8A8Kernels(library)
