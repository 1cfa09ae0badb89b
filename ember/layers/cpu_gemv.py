"""A compiled GEMV for the CPU (float32 or bfloat16 weights): decode-time products with a few rows, at memory speed.

At batch 1 a decode step reads every weight once and does two flops per byte read, so it is
bound by memory bandwidth; torch's own small-row products reach about a third of what this
machine can read. This kernel streams each weight row once per call, in parallel over rows on
the same OpenMP runtime torch uses. It is built on first use (ember.native_build); where no
compiler exists, or with EMBER_PURE_TORCH=1, `load_gemv()` returns None and torch does the work.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

SOURCE = r"""
#include <stdint.h>
#include <stddef.h>
/* y[i, n] = sum_j x[i, j] * w[n, j] (+ bias[n]); w row-major [rows, cols]; few rows of x. */
void ember_gemv_f32(const float *x, const float *w, const float *bias, float *y,
                    int64_t m, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < rows; n++) {
        const float *row = w + (size_t)n * (size_t)cols;
        for (int64_t i = 0; i < m; i++) {
            const float *xi = x + (size_t)i * (size_t)cols;
            float sum = 0.0f;
            #pragma omp simd reduction(+:sum)
            for (int64_t j = 0; j < cols; j++) sum += row[j] * xi[j];
            y[(size_t)i * (size_t)rows + n] = sum + (bias ? bias[n] : 0.0f);
        }
    }
}

static inline float bf16_to_f32(uint16_t value) {
    union { uint32_t bits; float number; } converted;
    converted.bits = (uint32_t)value << 16;
    return converted.number;
}

/* The same with bfloat16 weights (half the bytes to read); x, bias and y in float32. */
void ember_gemv_bf16(const float *x, const uint16_t *w, const float *bias, float *y,
                     int64_t m, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < rows; n++) {
        const uint16_t *row = w + (size_t)n * (size_t)cols;
        for (int64_t i = 0; i < m; i++) {
            const float *xi = x + (size_t)i * (size_t)cols;
            float sum = 0.0f;
            #pragma omp simd reduction(+:sum)
            for (int64_t j = 0; j < cols; j++) sum += bf16_to_f32(row[j]) * xi[j];
            y[(size_t)i * (size_t)rows + n] = sum + (bias ? bias[n] : 0.0f);
        }
    }
}
"""

PURE_TORCH_ENV = "EMBER_PURE_TORCH"
MAX_ROWS = 4  # beyond a few rows the product is compute-bound and torch's GEMM wins


class Gemv:
    """The compiled kernels, callable on contiguous CPU tensors (float32 or bfloat16 weights)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._functions = {torch.float32: library.ember_gemv_f32, torch.bfloat16: library.ember_gemv_bf16}
        for function in self._functions.values():
            function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
            function.restype = None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ weight.T + bias, accumulated in float32, returned in x's dtype."""
        rows, cols = weight.shape
        x32 = x.float().contiguous()
        bias32 = None if bias is None else bias.float().contiguous()
        out = torch.empty(x.shape[0], rows, dtype=torch.float32)
        self._functions[weight.dtype](
            x32.data_ptr(),
            weight.data_ptr(),
            None if bias32 is None else bias32.data_ptr(),
            out.data_ptr(),
            x.shape[0],
            rows,
            cols,
        )
        return out.to(x.dtype)


@functools.cache
def load_gemv() -> Gemv | None:
    """The kernel, built and loaded once per process; None when unavailable."""
    if os.environ.get(PURE_TORCH_ENV):
        return None
    from ember.native_build import build_shared_library

    path = build_shared_library("ember_gemv", SOURCE, ("-O3", "-march=native", "-fopenmp"))
    if path is None:
        return None
    try:
        return Gemv(ctypes.CDLL(str(path)))
    except OSError:
        return None


def can_use(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a kernel applies: a few contiguous CPU rows, float32 or bfloat16, no autograd."""
    return (
        x.dim() == 2
        and x.shape[0] <= MAX_ROWS
        and weight.dtype in (torch.float32, torch.bfloat16)
        and x.dtype == weight.dtype
        and x.device.type == "cpu"
        and weight.is_contiguous()
        and not torch.is_grad_enabled()
    )
