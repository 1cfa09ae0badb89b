"""LoRA beside a linear layer: out = base(x) + B_s (A_s x) for the rows whose request holds adapter slot s.

One step batches requests of different adapters (and of none). Punica's SGMV / S-LoRA idea, in torch: the step's
rows are grouped by adapter slot once (`LoRARows`), and every adapted layer does, per slot present, a gather of
those rows, two small matrix products (shrink to rank r, expand to the output) and a scatter-add into the base
layer's output. Rows without an adapter are never touched, so the base product stays the layer's own (float
panels, GGML blocks, W8A8 rows: whatever `base` is); the adapter stays float beside it (QLoRA serving).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ember.layers.cpu_gemm import CompiledProduct, CompiledProductSource
from ember.native_build import load_cpu_kernels

SOURCE_PATH = Path(__file__).parent / "csrc" / "lora.c"


@dataclass(frozen=True)
class LoRAProduct:
    """One adapter's product on one layer: shrink by `a` [k, in], then expand each segment of the output.

    A plain layer has one segment. A fused layer (q/k/v, gate/up) stacks the A of each part the adapter adapts
    (k = parts x r), and each part's B reads its own r columns of the shrunk row: `segments` holds (first output
    row, end output row, first column) per adapted part. `b_t` holds each segment's B transposed ([r, rows], so the
    expansion runs along contiguous output rows), one after another, flat: no block-diagonal zeros to read. The
    scaling (alpha / r, or alpha / sqrt(r)) is folded into it."""

    a: torch.Tensor
    b_t: torch.Tensor
    segments: torch.Tensor  # int64 [num_segments, 3]

    @classmethod
    def of_parts(cls, a: torch.Tensor, b_parts: list[torch.Tensor], segments: list[tuple[int, int, int]]) -> LoRAProduct:
        """The product of stacked `a` and each segment's B [rows, r] (scaled already)."""
        b_t = torch.cat([b.T.contiguous().flatten() for b in b_parts])
        return cls(a.contiguous(), b_t, torch.tensor(segments, dtype=torch.int64))

    @property
    def part_rank(self) -> int:
        return self.a.shape[0] // self.segments.shape[0]

    def delta(self, x: torch.Tensor, out_features: int) -> torch.Tensor:
        """B (A x) for rows x [rows, in] as [rows, out_features], in the wider of x's and the adapter's dtypes (a
        bfloat16 adapter beside float32 activations is widened, as the compiled path widens it)."""
        dtype = torch.promote_types(x.dtype, self.a.dtype)
        shrunk = x.to(dtype) @ self.a.to(dtype).T
        delta = shrunk.new_zeros(x.shape[0], out_features)
        offset, rank = 0, self.part_rank
        for start, end, column in self.segments.tolist():
            b_t = self.b_t[offset : offset + rank * (end - start)].view(rank, end - start).to(dtype)
            delta[:, start:end] = shrunk[:, column : column + rank] @ b_t
            offset += rank * (end - start)
        return delta


@dataclass
class LoRARows:
    """This step's rows grouped by adapter slot: [(slot, rows)], rows a slice where contiguous, else an index tensor.

    One object per adapted model, shared by its `LoRALinear` layers and rewritten by the adapter pool before each
    forward (the rows of a step are the same for every layer); empty when no row of the step has an adapter."""

    groups: list[tuple[int, slice | torch.Tensor]] = field(default_factory=list)
    # For compiled callers (lora.c): the address of the step's int32 slot per row (0: no adapter in the step), and
    # how many rows it covers; the cells stay put, so every layer's C struct points at them once.
    slots_address: ctypes.c_void_p = field(default_factory=ctypes.c_void_p, init=False)
    num_rows: ctypes.c_int64 = field(default_factory=ctypes.c_int64, init=False)
    _row_slots: torch.Tensor | None = field(default=None, init=False, repr=False)  # what slots_address points into

    def set_rows(self, row_slots: list[int]) -> None:
        """Group rows by their slot (-1: no adapter) for the next forward."""
        by_slot: dict[int, list[int]] = {}
        for row, slot in enumerate(row_slots):
            if slot >= 0:
                by_slot.setdefault(slot, []).append(row)
        self.groups = [(slot, _as_rows(rows)) for slot, rows in by_slot.items()]
        self._row_slots = torch.tensor(row_slots, dtype=torch.int32) if self.groups else None
        self.slots_address.value = None if self._row_slots is None else self._row_slots.data_ptr()
        self.num_rows.value = len(row_slots)


def _as_rows(rows: list[int]) -> slice | torch.Tensor:
    """A contiguous run as a slice (a view, no gather), else an index tensor."""
    if rows[-1] - rows[0] + 1 == len(rows):
        return slice(rows[0], rows[-1] + 1)
    return torch.tensor(rows, dtype=torch.long)


class LoRALinear(nn.Module):
    """A linear layer (float or quantized: `base`) with a fixed number of adapter slots beside it.

    `slots[s]` is the product of the adapter the pool put in slot s, or None where that adapter does not touch
    this layer (or the slot is free). The slots are filled and emptied by the adapter pool; the forward reads
    `rows`, the step's grouping, and adds each present slot's product to its rows only. Every slot's products are
    in `dtype` (float32 or bfloat16 run in the compiled path, others in the Python forward)."""

    def __init__(self, base: nn.Module, rows: LoRARows, num_slots: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.base = base
        self.reset(rows, num_slots, dtype)

    def reset(self, rows: LoRARows, num_slots: int, dtype: torch.dtype = torch.float32) -> None:
        """Empty slots for products in `dtype`, reading `rows` (a new adapter pool taking this layer over)."""
        self.rows = rows
        self.dtype = dtype
        self.slots: list[LoRAProduct | None] = [None] * num_slots
        self._c_a, self._c_b = (ctypes.c_void_p * num_slots)(), (ctypes.c_void_p * num_slots)()
        self._c_ranks, self._c_part_ranks = (ctypes.c_int64 * num_slots)(), (ctypes.c_int64 * num_slots)()
        self._c_segments, self._c_num_segments = (ctypes.c_void_p * num_slots)(), (ctypes.c_int64 * num_slots)()
        self._c_weight = _LoRAWeight(
            row_slots=ctypes.addressof(rows.slots_address), num_rows=ctypes.addressof(rows.num_rows),
            a=ctypes.addressof(self._c_a), b=ctypes.addressof(self._c_b), ranks=ctypes.addressof(self._c_ranks),
            part_ranks=ctypes.addressof(self._c_part_ranks), segments=ctypes.addressof(self._c_segments),
            num_segments=ctypes.addressof(self._c_num_segments), num_slots=num_slots,
        )

    def set_slot(self, slot: int, product: LoRAProduct | None) -> None:
        """Put an adapter's product (None: it skips this layer) into `slot`, for the Python and the compiled path."""
        if product is not None and product.a.dtype != self.dtype:
            raise ValueError(f"a {product.a.dtype} adapter product cannot go into slots of {self.dtype}")
        self.slots[slot] = product
        self._c_a[slot] = None if product is None else product.a.data_ptr()
        self._c_b[slot] = None if product is None else product.b_t.data_ptr()
        self._c_ranks[slot] = 0 if product is None else product.a.shape[0]
        self._c_part_ranks[slot] = 0 if product is None else product.part_rank
        self._c_segments[slot] = None if product is None else product.segments.data_ptr()
        self._c_num_segments[slot] = 0 if product is None else product.segments.shape[0]

    def compiled_product(self) -> CompiledProduct | None:
        """The base's compiled product with the slots' products after it (lora.c), for the compiled decoder layer;
        None where the base has none, the kernel is unavailable or the products are neither float32 nor bfloat16 (the
        Python forward runs then). The compiled layer's activations are float32; bfloat16 products are widened."""
        library = load_lora_kernel()
        base = self.base.compiled_product() if isinstance(self.base, CompiledProductSource) else None
        kernels = {torch.float32: "ember_lora_gemm", torch.bfloat16: "ember_lora_gemm_bf16"}
        if library is None or base is None or self.dtype not in kernels:
            return None
        self._c_weight.base, self._c_weight.base_weight, self._c_weight.base_bias = base.gemm, base.weight, base.bias
        address = ctypes.cast(getattr(library, kernels[self.dtype]), ctypes.c_void_p).value
        return CompiledProduct(address, ctypes.addressof(self._c_weight), None, base.in_features, base.max_rows, (self, base))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if not self.rows.groups or self._add_compiled(x, out):
            return out
        for slot, rows in self.rows.groups:
            product = self.slots[slot]
            if product is None:
                continue
            if isinstance(rows, slice):
                out[rows] += product.delta(x[rows], out.shape[-1]).to(out.dtype)
            else:
                out.index_add_(0, rows, product.delta(x.index_select(0, rows), out.shape[-1]).to(out.dtype))
        return out


    def _add_compiled(self, x: torch.Tensor, out: torch.Tensor) -> bool:
        """Add every row's slot product to `out` in one lora.c call (a prefill's many rows take this Python forward:
        one pass over the rows, not a gather, two products and a scatter per adapter); False where lora.c cannot
        (no kernel, rows that are not contiguous float32 on the CPU, products of another dtype)."""
        library = load_lora_kernel()
        kernel = {torch.float32: "ember_lora_add", torch.bfloat16: "ember_lora_add_bf16"}.get(self.dtype)
        is_plain = all(t.dtype == torch.float32 and t.device.type == "cpu" and t.dim() == 2 and t.is_contiguous() for t in (x, out))
        if library is None or kernel is None or not is_plain:
            return False
        getattr(library, kernel)(ctypes.c_void_p(x.data_ptr()), ctypes.byref(self._c_weight), ctypes.c_void_p(out.data_ptr()),
                                 ctypes.c_int64(x.shape[0]), ctypes.c_int64(out.shape[1]), ctypes.c_int64(x.shape[1]))
        return True


class _LoRAWeight(ctypes.Structure):
    """lora.c's lora_weight: the base product, the step's rows and the slots' matrices (addresses)."""

    _fields_ = [
        ("base", ctypes.c_void_p), ("base_weight", ctypes.c_void_p), ("base_bias", ctypes.c_void_p),
        ("row_slots", ctypes.c_void_p), ("num_rows", ctypes.c_void_p), ("a", ctypes.c_void_p), ("b", ctypes.c_void_p),
        ("ranks", ctypes.c_void_p), ("part_ranks", ctypes.c_void_p), ("segments", ctypes.c_void_p),
        ("num_segments", ctypes.c_void_p), ("num_slots", ctypes.c_int64),
    ]


@functools.cache
def load_lora_kernel() -> ctypes.CDLL | None:
    """lora.c built and loaded once per process; None when unavailable."""
    return load_cpu_kernels("ember_lora", SOURCE_PATH)
