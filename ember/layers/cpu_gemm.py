"""A compiled GEMM for the CPU over weights packed at load (float32 or bfloat16): decode at memory speed.

A decode step multiplies a few rows (1..64 sequences) by every weight matrix: torch's products
reach a fraction of this machine's memory bandwidth there, and its bfloat16 products have no
native math on CPUs without AVX512-BF16. `ember/layers/csrc/gemm.c` reads each weight once per
block of rows from panels of 16 output channels (packed once at load, replacing the dense copy),
widens bfloat16 to float32 in registers and accumulates in float32, on the OpenMP runtime torch
uses. Where the CPU has AVX512-BF16, bfloat16 weights take its dot-product instruction instead
(vdpbf16ps: 32 weights per instruction): the activations are then rounded to bfloat16 first, as
transformers and llama.cpp do for a bfloat16 model, and the sums stay float32. Where it also has
AMX, products of 4 rows or more run on tiles (csrc/amx_gemm.h: 7-10x the vdpbf16ps walk on a
prefill chunk, 1.8-3.5x on an 8-16-row decode step). It is built on
first use with -march=native (ember.native_build); where no compiler exists, or with
EMBER_PURE_TORCH=1, `load_gemm()` returns None and torch does the work.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from ember.native_build import load_cpu_kernels

PANEL_WIDTH = 16  # output channels per panel (NR in gemm.c)
SOURCE_PATH = Path(__file__).parent / "csrc" / "gemm.c"
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
# bfloat16 panels pair column j with column j + 8 in one 32-bit lane: position of each column.
_BF16_POSITIONS = torch.tensor([2 * (j % 8) + j // 8 for j in range(PANEL_WIDTH)])


@dataclass(frozen=True)
class CompiledProduct:
    """A product as C code calls it: `gemm(x, weight, bias, y, m, n, k)` gives y = x W^T + b for m rows.

    The compiled decoder layer runs its four products through these, whatever holds the weight
    (packed panels, GGML blocks). `max_rows` is the most rows the product should take from C (None:
    any): beyond it the caller takes the Python path, which may pick another method (GGML prefill
    dequantizes tiles for torch's GEMM). `owner` keeps what `weight` and `bias` point into alive.
    """

    gemm: int
    weight: int
    bias: int | None
    in_features: int
    max_rows: int | None
    owner: object


@runtime_checkable
class CompiledProductSource(Protocol):
    """A layer whose product a compiled caller can take (a packed `Linear`, GGML block layers)."""

    def compiled_product(self) -> CompiledProduct | None:
        """The product as C code calls it; None where this layer cannot hand it over now."""


@dataclass(frozen=True)
class PackedWeight:
    """A [out_features, in_features] weight as k-major panels of 16 output channels (plus its bias).

    `panels[t, p, j]` is weight[16 t + j, p] for float32. bfloat16 panels come in the layout the
    kernel of this CPU reads (`bf16_pairs`): with AVX512-BF16, `panels[t, q, j, r]` is
    weight[16 t + j, 2 q + r] (adjacent k paired, in_features padded to even with zeros); else
    `panels[t, p, :]` stores its columns in the order `_BF16_POSITIONS` gives, so the kernel widens
    a lane pair with a shift and a mask. Rows past `out_features` are zero; the bias (float32) is
    zero-padded the same way.
    """

    panels: torch.Tensor  # [num_panels, in_features, 16], or [num_panels, ceil(in_features / 2), 16, 2]
    out_features: int
    in_features: int
    bias: torch.Tensor | None  # [num_panels * 16] float32

    @staticmethod
    def panel_shape(out_features: int, in_features: int, dtype: torch.dtype, bf16_pairs: bool | None = None) -> tuple[int, ...]:
        """Shape of the panels `from_dense` makes for such a weight (to reserve their memory first)."""
        num_panels = -(-out_features // PANEL_WIDTH)
        if dtype == torch.bfloat16 and (bfloat16_pairs() if bf16_pairs is None else bf16_pairs):
            return (num_panels, -(-in_features // 2), PANEL_WIDTH, 2)
        return (num_panels, in_features, PANEL_WIDTH)

    @classmethod
    def from_dense(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, bf16_pairs: bool | None = None,
                   out: torch.Tensor | None = None) -> PackedWeight:
        """`bf16_pairs` None: the layout this CPU's kernel reads (a kernel built for another CPU may want the other).
        `out`: where to write the panels (of `panel_shape`, e.g. from a `WeightArena`); else a new tensor."""
        out_features, in_features = weight.shape
        num_panels = -(-out_features // PANEL_WIDTH)
        pairs = weight.dtype == torch.bfloat16 and (bfloat16_pairs() if bf16_pairs is None else bf16_pairs)
        width = in_features + (in_features % 2 if pairs else 0)
        if (num_panels * PANEL_WIDTH, width) == weight.shape:
            padded = weight  # nothing to pad: the panels are one transposing copy of the weight
        else:
            padded = weight.new_zeros(num_panels * PANEL_WIDTH, width)
            padded[:out_features, :in_features] = weight
        panels = padded.view(num_panels, PANEL_WIDTH, padded.shape[1]).transpose(1, 2)
        if pairs:
            panels = panels.reshape(num_panels, padded.shape[1] // 2, 2, PANEL_WIDTH).transpose(2, 3)
        elif weight.dtype == torch.bfloat16:
            panels = panels[:, :, torch.argsort(_BF16_POSITIONS)]
        packed_bias = None
        if bias is not None:
            packed_bias = torch.zeros(num_panels * PANEL_WIDTH, dtype=torch.float32)
            packed_bias[:out_features] = bias.float()
        if out is not None and (out.shape != panels.shape or out.dtype != panels.dtype):
            raise ValueError(f"panels of {tuple(panels.shape)} {panels.dtype} cannot go into a {tuple(out.shape)} {out.dtype} tensor: "
                             "reserve it with PackedWeight.panel_shape")
        return cls(panels.contiguous() if out is None else out.copy_(panels), out_features, in_features, packed_bias)

    @property
    def dtype(self) -> torch.dtype:
        return self.panels.dtype

    @property
    def is_paired(self) -> bool:
        """bfloat16 panels with adjacent k paired per lane (the AVX512-BF16 kernel's layout)."""
        return self.panels.dim() == 4

    @property
    def dense_shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    def rows(self, indices: torch.Tensor) -> torch.Tensor:
        """weight[indices] ([*indices.shape, in_features]), read from the panels (a tied embedding's lookup)."""
        columns = indices % PANEL_WIDTH
        if self.is_paired:
            paired = self.panels[indices // PANEL_WIDTH, :, columns]  # [*indices.shape, in_features / 2, 2]
            return paired.flatten(-2)[..., : self.in_features]
        if self.dtype == torch.bfloat16:
            columns = _BF16_POSITIONS[columns]
        return self.panels[indices // PANEL_WIDTH, :, columns]

    def dense(self) -> torch.Tensor:
        """The [out_features, in_features] weight again (for tests and the torch reference)."""
        return self.rows(torch.arange(self.out_features))

    def compiled_product(self) -> CompiledProduct | None:
        """This weight's product for C callers (any row count); None without the compiled kernel."""
        gemm = load_gemm()
        if gemm is None:
            return None
        return CompiledProduct(
            gemm.address_for(self.dtype), self.panels.data_ptr(), None if self.bias is None else self.bias.data_ptr(),
            self.in_features, None, self,
        )


class Gemm:
    """The compiled kernels, callable on CPU tensors against a `PackedWeight`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        self._functions = {torch.float32: library.ember_gemm_f32, torch.bfloat16: library.ember_gemm_bf16}
        for function in self._functions.values():
            function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
            function.restype = None
        library.ember_gemm_bf16_pairs.restype = ctypes.c_int
        self.bfloat16_pairs = bool(library.ember_gemm_bf16_pairs())
        library.ember_gemm_bf16_tile_rows.restype = ctypes.c_int
        # From this many rows bfloat16 products run on AMX tiles (None: never, no AMX here): the same rounded
        # inputs and exact products, summed in another order, so a row's bits depend on which side it ran.
        self.bfloat16_tile_rows = library.ember_gemm_bf16_tile_rows() or None

    def address_for(self, dtype: torch.dtype) -> int:
        """The C function for panels of `dtype` (a `gemm_fn`: x, panels, bias, y, m, n, k)."""
        return ctypes.cast(self._functions[dtype], ctypes.c_void_p).value

    def __call__(self, x: torch.Tensor, weight: PackedWeight) -> torch.Tensor:
        """x [m, in_features] @ weight.T + bias, accumulated in float32, returned in float32."""
        x32 = x.float().contiguous()
        out = torch.empty(x.shape[0], weight.out_features, dtype=torch.float32)
        self._functions[weight.dtype](
            x32.data_ptr(),
            weight.panels.data_ptr(),
            None if weight.bias is None else weight.bias.data_ptr(),
            out.data_ptr(),
            x.shape[0],
            weight.out_features,
            weight.in_features,
        )
        return out


def bfloat16_pairs() -> bool:
    """Whether this CPU's kernel reads bfloat16 panels as adjacent-k pairs (AVX512-BF16), rounding activations."""
    gemm = load_gemm()
    return gemm is not None and gemm.bfloat16_pairs


@functools.cache
def load_gemm() -> Gemm | None:
    """The kernel, built and loaded once per process; None when unavailable."""
    library = load_cpu_kernels("ember_gemm", SOURCE_PATH)
    return None if library is None else Gemm(library)
