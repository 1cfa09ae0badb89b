"""The compiled GGML kernels (ggml_source.c): dequantize rows of blocks, and few-row products.

Built on first use through ember.native_build with -march=native, so the instruction set is the
one of the CPU found at run time (AVX2 + FMA intrinsics where the compiler defines __AVX2__, with
AVX-VNNI / AVX512-VNNI integer dot products where defined; a portable C loop elsewhere).
The few-row product has three paths (see ggml_source.c): "int8" quantizes the activations to
int8 per 32 values and runs integer dot products (the fast one, and the default where built),
"float32" keeps float32 activations (exact up to summation order), "portable" is plain C. -ffp-contract=off keeps the dequantization bit-exact with the
`gguf` package; the products use explicit FMA intrinsics, which the flag does not touch.
Where no compiler exists, or with EMBER_PURE_TORCH=1, `load_kernels()` returns None and the
layers fall back to `dequantize_torch` + torch's matmul.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Protocol

import torch

from ember.native_build import EXACT_CPU_KERNEL_FLAGS, load_cpu_kernels

SOURCE_PATH = Path(__file__).with_name("ggml_source.c")
MAX_GEMV_ROWS = 8  # the C kernel's MAX_M: the rows one pass over the weight computes
# Up to this many rows a product runs as GEMV passes of MAX_GEMV_ROWS rows (each row the bits of a
# one-row decode); beyond it dequantized tiles and torch.mm win. Measured on AVX2 (SmolLM2 Q4_1
# gate_up / down, Q8_0 LM head): passes 2.4x faster at 16 rows, 1.2x at 32, even at 64, 0.7x at 128.
MAX_PASS_ROWS = 48
GEMV_PATHS = ("int8", "float32", "portable")  # the C enum's order
INT8_DOT_KINDS = ("avx2", "avx512vnni", "avxvnni")  # ember_ggml_int8_dot_kind()'s values
# With VNNI dot products the int8 passes win at any row count: measured on an AMD EPYC with AVX-VNNI, 64 to 1024
# rows, 1.3-3.7x the tiles on SmolLM2's Q4_1 and Qwen2.5-Coder's Q4_K / Q5_0 / Q6_K / Q8_0 layers (a dequantized
# tile costs a float32 copy of the weight per call; the passes read the blocks and run 4x the MACs per instruction).
INT8_PASSES_AT_ANY_ROWS = ("avx512vnni", "avxvnni")


class BlockFormat(Protocol):
    """What the kernels read of a block format (ember.quant.ggml.blocks.GGMLFormat)."""

    @property
    def type_id(self) -> int: ...

    @property
    def has_int8_kernel(self) -> bool: ...


class BlockWeight(Protocol):
    """What the kernels read of a weight in blocks (ember.quant.ggml.blocks.GGMLTensor, which dequantizes through
    these kernels, so the kernels name only its shape): uint8 rows of whole blocks, their format, [rows, cols]."""

    data: torch.Tensor

    @property
    def format(self) -> BlockFormat: ...

    @property
    def shape(self) -> tuple[int, int]: ...


class GGMLWeightPointer(ctypes.Structure):
    """ggml_source.c's `ggml_weight`: what `ember_ggml_linear` (a gemm_fn) takes as its weight pointer. A plain
    GGML weight sets the first three fields; a GPTQ / AWQ weight (ember.quant.ggml.zero_point) also the zero-point ones;
    a weight of row parts in different formats only `row_parts` (a `RowPartsPointer`)."""

    _fields_ = [
        ("type", ctypes.c_int), ("path", ctypes.c_int), ("blocks", ctypes.c_void_p),
        ("input_order", ctypes.c_void_p), ("offsets", ctypes.c_void_p), ("column_groups", ctypes.c_void_p),
        ("groups", ctypes.c_int64), ("row_parts", ctypes.c_void_p),
    ]


MAX_ROW_PARTS = 4  # ggml_source.c's ggml_row_parts holds this many


class RowPartsPointer(ctypes.Structure):
    """ggml_source.c's `ggml_row_parts`: each part's `GGMLWeightPointer` and its rows, in output order."""

    _fields_ = [
        ("count", ctypes.c_int64), ("weights", ctypes.c_void_p * MAX_ROW_PARTS), ("rows", ctypes.c_int64 * MAX_ROW_PARTS),
    ]


class GGMLKernels:
    """ctypes bindings of the compiled library."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        self.linear_address = ctypes.cast(library.ember_ggml_linear, ctypes.c_void_p).value
        self._linear = library.ember_ggml_linear
        self._linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
        self._linear.restype = None
        self._gemv = library.ember_ggml_gemv
        self._gemv.argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 4, *[ctypes.c_int64] * 3, ctypes.c_int]
        self._gemv.restype = ctypes.c_int
        self._dequantize = library.ember_ggml_dequantize
        self._dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self._dequantize.restype = None
        library.ember_ggml_tile_rows.restype = ctypes.c_int
        # From this many rows an int8-path product runs on AMX tiles (None: never): x and the weights rounded to bfloat16.
        self.tile_rows = library.ember_ggml_tile_rows() or None
        mask = library.ember_ggml_paths()
        self.paths = tuple(path for bit, path in enumerate(GEMV_PATHS) if mask >> bit & 1)
        self.int8_dot_kind = INT8_DOT_KINDS[library.ember_ggml_int8_dot_kind()] if "int8" in self.paths else None
        self._path_index = {activations: GEMV_PATHS.index(self._best_path(activations)) for activations in ("int8", "float32")}

    def dequantize(self, weight: BlockWeight) -> torch.Tensor:
        """float32 [rows, cols], bit-exact with the `gguf` package."""
        rows, cols = weight.shape
        out = torch.empty(rows, cols, dtype=torch.float32)
        self._dequantize(weight.format.type_id, weight.data.data_ptr(), out.data_ptr(), rows, cols)
        return out

    @property
    def default_path(self) -> str:
        """The fastest path this build has."""
        return self.paths[0]

    def _best_path(self, activations: str) -> str:
        wanted = ("int8", "float32", "portable") if activations == "int8" else ("float32", "portable")
        return next(p for p in wanted if p in self.paths)

    def format_path(self, format: BlockFormat, activations: str) -> int:
        """The path index a weight of `format` runs on for `activations` (float32 where the format has no int8 kernel)."""
        return self.path_for(activations if format.has_int8_kernel else "float32")

    def runs_in_passes(self, path_index: int, num_rows: int) -> bool:
        """Whether a product of `num_rows` rows on `path_index` runs as GEMV passes (else over dequantized tiles):
        up to MAX_PASS_ROWS rows always, any number on the int8 path where this CPU has VNNI."""
        return num_rows <= MAX_PASS_ROWS or (
            path_index == GEMV_PATHS.index("int8") and self.int8_dot_kind in INT8_PASSES_AT_ANY_ROWS
        )

    def on_tiles(self, path_index: int, num_rows: int) -> bool:
        """Whether a product of `num_rows` rows on `path_index` runs on AMX tiles (bfloat16 x and weights)."""
        return path_index == GEMV_PATHS.index("int8") and self.tile_rows is not None and num_rows >= self.tile_rows

    def path_for(self, activations: str) -> int:
        """The C path index for activations "int8" (falls back to float32) or "float32" (falls back to portable)."""
        return self._path_index[activations]

    def gemv(self, x: torch.Tensor, weight: BlockWeight, bias: torch.Tensor | None, path: str | None = None) -> torch.Tensor:
        """x [m, cols] @ weight.T (+ bias) on `path` (default: the fastest), float32 out, MAX_GEMV_ROWS rows per pass."""
        path = self.default_path if path is None else path
        if path not in self.paths:
            raise ValueError(f"the GGML kernels were built without the {path!r} path; this CPU has {', '.join(self.paths)}")
        rows, cols = weight.shape
        return self.gemv_blocks(x, weight.data, weight.format.type_id, bias, rows, cols, GEMV_PATHS.index(path))

    def linear(self, x: torch.Tensor, weight: GGMLWeightPointer, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
        """`ember_ggml_linear` as the compiled decoder layer calls it: x [m, cols] float32 contiguous, float32 out."""
        m, cols = x.shape
        out = torch.empty(m, rows, dtype=torch.float32)
        self._linear(x.data_ptr(), ctypes.addressof(weight), None if bias is None else bias.data_ptr(), out.data_ptr(), m, rows, cols)
        return out

    def gemv_blocks(self, x: torch.Tensor, blocks: torch.Tensor, type_id: int, bias: torch.Tensor | None, rows: int, cols: int,
                    path_index: int) -> torch.Tensor:
        """`gemv` on raw block bytes (contiguous uint8 [rows, row_bytes]): the per-token hot call, kept lean."""
        if x.dtype != torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()
        if bias is not None and bias.dtype != torch.float32:
            bias = bias.float()
        m = x.shape[0]
        if m < 1:
            raise ValueError("the GGML GEMV needs at least one row")
        out = torch.empty(m, rows, dtype=torch.float32)
        status = self._gemv(type_id, x.data_ptr(), blocks.data_ptr(), None if bias is None else bias.data_ptr(),
                            out.data_ptr(), m, rows, cols, path_index)
        if status != 0:
            raise ValueError(f"the GGML GEMV failed on {m} rows (status {status})")
        return out


@functools.cache
def load_kernels() -> GGMLKernels | None:
    """The kernels, built and loaded once per process; None when unavailable."""
    library = load_cpu_kernels("ember_ggml", SOURCE_PATH, EXACT_CPU_KERNEL_FLAGS)
    return None if library is None else GGMLKernels(library)
