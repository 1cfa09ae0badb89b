"""The compiled elementwise ops of a decoder layer (ember/layers/csrc/elementwise.c), callable on tensors.

RMSNorm with the residual add fused, rotary positions in place, and SwiGLU's silu(gate) * up:
one C call each where torch dispatches a chain of small ops, whose overhead (not arithmetic) is
what a decode step of a small model spends outside its products. Float32 activations on the
CPU only: each method says False / returns None for anything else, and the layer that called it
runs its torch code (also the reference in tests). `load_elementwise()` is None without a
compiler or with EMBER_PURE_TORCH=1.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from ember.native_build import load_cpu_kernels

SOURCE_PATH = Path(__file__).parent / "csrc" / "elementwise.c"
NORM_WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


def _is_cpu_float32(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.device.type == "cpu"


class ElementwiseOps:
    """The compiled ops; every method leaves its inputs alone unless its name ends in `_`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library  # the compiled decoder layer calls its functions too
        self._rms_norm = library.ember_rms_norm
        self._rms_norm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int64] * 2 + [
            ctypes.c_float]
        self._rotary = library.ember_rotary
        self._rotary.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 3 + [ctypes.c_int64]
        self._silu_mul = library.ember_silu_mul
        self._silu_mul.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
        for function in (self._rms_norm, self._silu_mul):
            function.restype = None
        self._rotary.restype = ctypes.c_int

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rmsnorm(s) * weight, s) with s = x + delta (x itself without delta); None if it cannot run."""
        operands = (x,) if delta is None else (x, delta)
        if not all(_is_cpu_float32(t) and t.is_contiguous() and t.shape == x.shape for t in operands):
            return None
        if weight.dtype not in NORM_WEIGHT_DTYPES or not weight.is_contiguous() or weight.shape != x.shape[-1:]:
            return None
        out = torch.empty_like(x)
        total = x if delta is None else torch.empty_like(x)
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        self._rms_norm(
            x.data_ptr(), None if delta is None else delta.data_ptr(), total.data_ptr(), weight.data_ptr(),
            int(weight.dtype == torch.bfloat16), out.data_ptr(), rows, x.shape[-1], eps,
        )
        return out, total

    def rotary_(self, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        """Rotate x [tokens, heads, head_dim] in place by each token's position; False (untouched) if it cannot.

        Tokens may be strided (a view into a fused projection); each token's heads must be one
        contiguous run. cos/sin are the full-width float32 tables [max_positions, head_dim].
        """
        tokens, heads, head_dim = x.shape
        if not (_is_cpu_float32(x) and x.stride(2) == 1 and x.stride(1) == head_dim):
            return False
        if positions.dtype != torch.int64 or not positions.is_contiguous() or positions.shape != (tokens,):
            return False
        if not (cos.is_contiguous() and sin.is_contiguous() and _is_cpu_float32(cos) and cos.shape[1] == head_dim):
            return False
        status = self._rotary(
            x.data_ptr(), tokens, heads, head_dim, x.stride(0), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            cos.shape[0],
        )
        if status != 0:
            raise ValueError(f"a position is outside the rotary tables (0..{cos.shape[0] - 1}): raise max_position_embeddings")
        return True

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up over rows [gate | up] ([..., 2 * inner] -> [..., inner]); None if it cannot run."""
        if not (_is_cpu_float32(gate_up) and gate_up.is_contiguous() and gate_up.shape[-1] % 2 == 0):
            return None
        inner = gate_up.shape[-1] // 2
        out = gate_up.new_empty(*gate_up.shape[:-1], inner)
        rows = gate_up.numel() // gate_up.shape[-1] if gate_up.numel() else 0
        self._silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, inner)
        return out


@functools.cache
def load_elementwise() -> ElementwiseOps | None:
    """The ops, built and loaded once per process; None when unavailable."""
    library = load_cpu_kernels("ember_elementwise", SOURCE_PATH)
    return None if library is None else ElementwiseOps(library)
