"""A Llama-family decoder layer as one compiled call (ember/layers/csrc/decoder_layer.c).

The layer's Python code calls a dozen compiled kernels per token batch; on a small model the
interpreter's share of each call (module dispatch, checks, argument marshalling) is a third of a
decode step. `CompiledDecoderLayer` holds the layer's weight pointers once (its four products as
`CompiledProduct`s, dense packed panels or GGML blocks alike; norm weights, rotary tables) and per
call fills only the step's pointers, then runs the same kernels in the same order in C: the same
bits as the Python path, which stays the reference and the fallback (`__call__` returns None for
anything it does not take, e.g. more rows than a GGML product takes from C: prefill).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from ember.layers.attention import AttentionMetadata
from ember.layers.cpu_attention import (
    CACHE_DTYPES,
    CACHE_FORMATS,
    AttentionArgs,
    load_attention,
    span_masks_pointer,
)
from ember.layers.cpu_elementwise import NORM_WEIGHT_DTYPES, load_elementwise
from ember.layers.cpu_gemm import CompiledProduct
from ember.native_build import load_cpu_kernels

SOURCE_PATH = Path(__file__).parent / "csrc" / "decoder_layer.c"


@runtime_checkable
class CompilableLayer(Protocol):
    """A decoder layer that can hand its forward to `CompiledDecoderLayer` (cpu_prepare calls these); `compiled` is
    that call while it runs compiled, else None."""

    compiled: CompiledDecoderLayer | None

    def compile_for_cpu(self) -> bool:
        """Run as one compiled call from now on where the weights fit; whether it will."""

    def drop_compiled(self) -> bool:
        """Back to the Python path (before weights change); whether it was compiled."""


class _Kernels(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("gemm", "rms_norm", "rotary", "silu_mul", "write_kv", "attention")]


class _Weights(ctypes.Structure):
    _fields_ = [
        ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("norms_bf16", ctypes.c_int),
        ("eps", ctypes.c_float),
        ("qkv", ctypes.c_void_p), ("o", ctypes.c_void_p), ("gate_up", ctypes.c_void_p), ("down", ctypes.c_void_p),
        ("qkv_bias", ctypes.c_void_p), ("o_bias", ctypes.c_void_p), ("gate_up_bias", ctypes.c_void_p),
        ("down_bias", ctypes.c_void_p),
        ("hidden", ctypes.c_int64), ("num_heads", ctypes.c_int64), ("num_kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64), ("inner", ctypes.c_int64),
        ("cos_table", ctypes.c_void_p), ("sin_table", ctypes.c_void_p), ("num_positions", ctypes.c_int64),
        ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
    ]


class _Step(ctypes.Structure):
    _fields_ = [
        ("m", ctypes.c_int64), ("x", ctypes.c_void_p), ("out", ctypes.c_void_p), ("scratch", ctypes.c_void_p),
        ("positions", ctypes.c_void_p), ("slots", ctypes.c_void_p), ("attention", AttentionArgs),
    ]


@dataclass(frozen=True)
class LayerShape:
    """What the compiled layer needs to know of the attention block besides its weights."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    eps: float


@dataclass(frozen=True)
class LayerWeights:
    """A pre-norm SwiGLU block's tensors: norms (dense), four products as C calls them, rotary tables, and (Qwen3)
    the norms of every query and key head."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: CompiledProduct
    o: CompiledProduct
    gate_up: CompiledProduct
    down: CompiledProduct
    cos: torch.Tensor
    sin: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None

    @property
    def products(self) -> tuple[CompiledProduct, ...]:
        return (self.qkv, self.o, self.gate_up, self.down)

    def compilable(self) -> bool:
        """One product function for the four, norms of one dtype the kernel reads (head norms both or neither), float32
        tables."""
        norms = tuple(n for n in (self.input_norm, self.post_norm, self.q_norm, self.k_norm) if n is not None)
        return (
            (self.q_norm is None) == (self.k_norm is None)
            and len({p.gemm for p in self.products}) == 1
            and len({n.dtype for n in norms}) == 1
            and all(n.dtype in NORM_WEIGHT_DTYPES and n.is_contiguous() for n in norms)
            and all(t.dtype == torch.float32 and t.is_contiguous() for t in (self.cos, self.sin))
        )

    def max_rows(self) -> int | None:
        """The most rows every product takes from C (None: any)."""
        limits = [p.max_rows for p in self.products if p.max_rows is not None]
        return min(limits, default=None)


@dataclass(frozen=True, eq=False)
class FinalNorm:
    """The model's RMSNorm after its last layer, folded into the stack call (one interpreter round trip less per
    step, and the first one after the weights streamed through the caches is the dearest)."""

    weight: torch.Tensor
    eps: float

    @classmethod
    def of(cls, weight: torch.Tensor, eps: float) -> FinalNorm | None:
        """The norm if the compiled kernel takes its weight (dtype, layout), else None."""
        if weight.dtype not in NORM_WEIGHT_DTYPES or not weight.is_contiguous() or weight.dim() != 1:
            return None
        return cls(weight, eps)

    def same_as(self, other: FinalNorm | None) -> bool:
        """The same weight memory (the kernel reads it in place) and eps."""
        return (
            other is not None and other.weight.data_ptr() == self.weight.data_ptr()
            and other.weight.dtype == self.weight.dtype and other.eps == self.eps
        )


class DecoderLayerKernel:
    """The compiled layer function and the addresses of the kernels it calls besides the products."""

    def __init__(self, library: ctypes.CDLL, shared_kernels: dict[str, int]) -> None:
        self._function = library.ember_decoder_layer
        self._function.argtypes = [ctypes.POINTER(_Weights), ctypes.POINTER(_Step), ctypes.POINTER(_Kernels)]
        self._function.restype = ctypes.c_int
        self._stack_function = library.ember_decoder_stack
        self._stack_function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.POINTER(_Step), ctypes.c_void_p] + [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_float]
        self._stack_function.restype = ctypes.c_int
        self._shared_kernels = shared_kernels

    def table_for(self, gemm: int) -> _Kernels:
        """The kernel table of a layer whose products run through `gemm`."""
        return _Kernels(gemm=gemm, **self._shared_kernels)

    def run(self, weights: _Weights, step: _Step, kernels: _Kernels) -> int:
        return self._function(ctypes.byref(weights), ctypes.byref(step), ctypes.byref(kernels))

    def run_stack(self, tables: StackTables, step: _Step, spare: int, final_norm: FinalNorm | None) -> int:
        """Every layer of `tables` in order, then `final_norm` if given (see ember_decoder_stack); 0 or the first
        failing status."""
        norm = (None, 0, 0.0) if final_norm is None else (
            final_norm.weight.data_ptr(), int(final_norm.weight.dtype == torch.bfloat16), final_norm.eps)
        return self._stack_function(
            tables.weights, tables.kernels, tables.keys, tables.values, tables.num_layers, ctypes.byref(step), spare, *norm
        )


class StackTables:
    """Per-layer pointer arrays of a stack call: weight and kernel tables fixed, caches set per step."""

    def __init__(self, weights: list[_Weights], kernels: list[_Kernels]) -> None:
        self.num_layers = len(weights)
        pointers = ctypes.c_void_p * self.num_layers
        self.weights = pointers(*(ctypes.addressof(w) for w in weights))
        self.kernels = pointers(*(ctypes.addressof(k) for k in kernels))
        self.keys, self.values = pointers(), pointers()

    def set_caches(self, kv_caches: list[torch.Tensor]) -> None:
        for i, cache in enumerate(kv_caches):
            keys = cache.data_ptr()
            self.keys[i], self.values[i] = keys, keys + cache.stride(0) * cache.element_size()


def _address(library: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


@functools.cache
def load_decoder_layer_kernel() -> DecoderLayerKernel | None:
    """The layer function with the other kernels' addresses; None when any of them is unavailable."""
    ops, attention = load_elementwise(), load_attention()
    library = load_cpu_kernels("ember_decoder_layer", SOURCE_PATH)
    if library is None or ops is None or attention is None:
        return None
    shared = {name: _address(ops.library, f"ember_{name}") for name in ("rms_norm", "rotary", "silu_mul")}
    shared["write_kv"] = _address(attention.library, "ember_write_kv")
    shared["attention"] = _address(attention.library, "ember_paged_attention")
    return DecoderLayerKernel(library, shared)


class CompiledDecoderLayer:
    """One Llama-family layer's forward as one compiled call; holds its weights alive."""

    def __init__(self, kernel: DecoderLayerKernel, weights: LayerWeights, shape: LayerShape) -> None:
        self._kernel = kernel
        self._tensors = weights  # the pointers below stay valid while this object lives
        self._kernels = kernel.table_for(weights.qkv.gemm)
        self._max_rows = weights.max_rows()
        self._inner = weights.down.in_features
        self._hidden = weights.qkv.in_features
        self._scale = shape.scale
        self._scratch_per_token = (
            2 * self._hidden + (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
            + shape.num_heads * shape.head_dim + 3 * self._inner
        )
        self._weights = _Weights(
            input_norm=weights.input_norm.data_ptr(), post_norm=weights.post_norm.data_ptr(),
            norms_bf16=int(weights.input_norm.dtype == torch.bfloat16), eps=shape.eps,
            qkv=weights.qkv.weight, o=weights.o.weight, gate_up=weights.gate_up.weight, down=weights.down.weight,
            qkv_bias=weights.qkv.bias, o_bias=weights.o.bias, gate_up_bias=weights.gate_up.bias,
            down_bias=weights.down.bias,
            hidden=self._hidden, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim, inner=self._inner,
            cos_table=weights.cos.data_ptr(), sin_table=weights.sin.data_ptr(), num_positions=weights.cos.shape[0],
            q_norm=None if weights.q_norm is None else weights.q_norm.data_ptr(),
            k_norm=None if weights.k_norm is None else weights.k_norm.data_ptr(),
        )
        self._step = _Step()

    @classmethod
    def build(cls, weights: LayerWeights, shape: LayerShape) -> CompiledDecoderLayer | None:
        """The compiled layer, or None where the kernels are unavailable or the weights do not fit them."""
        kernel = load_decoder_layer_kernel()
        head_norms = [n for n in (weights.q_norm, weights.k_norm) if n is not None]
        if kernel is None or not weights.compilable() or any(n.shape != (shape.head_dim,) for n in head_norms):
            return None
        if weights.cos.shape[1] != shape.head_dim:  # a partial rotation (Phi-4-mini) stays on the layers' Python path
            return None
        return cls(kernel, weights, shape)

    def __call__(
        self, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor | None:
        """The layer's output for x [m, hidden]; None (nothing done) for inputs the kernels do not take."""
        if not _fits(x, positions, kv_cache, metadata, self._hidden, self._max_rows):
            return None
        out, _scratch = _start_step(self._step, x, positions, kv_cache, metadata, self._scale, self._scratch_per_token)
        _check_status(self._kernel.run(self._weights, self._step, self._kernels))
        return out


class CompiledDecoderStack:
    """Consecutive compiled layers of one attention group run as one compiled call per step.

    A layer call still costs the interpreter tens of microseconds (checks, argument filling,
    module dispatch): on a small model that is several percent of a batch-1 decode step. The
    stack checks the step's inputs once and lets C walk the layers; the bits are the per-layer
    path's (the same function runs each layer). It refers to its layers' `CompiledDecoderLayer`s,
    so it must be rebuilt when any of them is (see `matches`). With a `final_norm` its output is
    the model's final hidden states (`applies_final_norm`).
    """

    def __init__(self, kernel: DecoderLayerKernel, layers: tuple[CompiledDecoderLayer, ...],
                 final_norm: FinalNorm | None = None) -> None:
        self.layers = layers
        self.final_norm = final_norm
        self._kernel = kernel
        self._tables = StackTables([layer._weights for layer in layers], [layer._kernels for layer in layers])
        self._hidden = layers[0]._hidden
        self._scale = layers[0]._scale
        self._scratch_per_token = max(layer._scratch_per_token for layer in layers)
        limits = [layer._max_rows for layer in layers if layer._max_rows is not None]
        self._max_rows = min(limits, default=None)
        self._step = _Step()
        self._caches: tuple[torch.Tensor, ...] = ()  # the caches the tables point at (checked when they were set)

    @classmethod
    def build(cls, layers: tuple[CompiledDecoderLayer | None, ...], final_norm: FinalNorm | None = None
              ) -> CompiledDecoderStack | None:
        """The stack of `layers` (then `final_norm`), or None unless every layer is compiled with the same width and
        scale. A final norm of another width is a broken model: ValueError (the kernel would read past its weight)."""
        if not layers or any(layer is None for layer in layers):
            return None
        if len({(layer._hidden, layer._scale) for layer in layers}) != 1:
            return None
        if final_norm is not None and final_norm.weight.shape[0] != layers[0]._hidden:
            raise ValueError(f"the final norm has {final_norm.weight.shape[0]} weights for hidden states of {layers[0]._hidden}")
        return cls(layers[0]._kernel, layers, final_norm)

    def _uses(self, kv_caches: list[torch.Tensor]) -> bool:
        """Whether the tables already point at these cache tensors (the same objects: a tensor's memory and shape
        stay its own, so the checks made when they were set still hold)."""
        return len(kv_caches) == len(self._caches) and all(a is b for a, b in zip(kv_caches, self._caches, strict=True))

    @property
    def applies_final_norm(self) -> bool:
        return self.final_norm is not None

    def matches(self, layers: tuple[CompiledDecoderLayer | None, ...], final_norm: FinalNorm | None = None) -> bool:
        """Whether this stack was built from exactly these compiled layers (same objects) and final norm."""
        return (
            len(layers) == len(self.layers) and all(a is b for a, b in zip(layers, self.layers, strict=True))
            and (final_norm is None if self.final_norm is None else self.final_norm.same_as(final_norm))
        )

    def __call__(
        self, x: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor], metadata: AttentionMetadata
    ) -> torch.Tensor | None:
        """The last layer's output for x [m, hidden], normed if the stack `applies_final_norm`; None (nothing done)
        for inputs a layer would not take."""
        first = kv_caches[0] if len(kv_caches) == len(self.layers) else None
        if first is None or not _fits(x, positions, first, metadata, self._hidden, self._max_rows):
            return None
        if not self._uses(kv_caches):
            if any(c.dtype != first.dtype or c.shape != first.shape or not c.is_contiguous() for c in kv_caches):
                return None
            self._tables.set_caches(kv_caches)
            self._caches = tuple(kv_caches)
        out, _scratch = _start_step(self._step, x, positions, first, metadata, self._scale, self._scratch_per_token)
        spare = torch.empty_like(x)
        _check_status(self._kernel.run_stack(self._tables, self._step, spare.data_ptr(), self.final_norm))
        return out


def _fits(
    x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata, hidden: int, max_rows: int | None
) -> bool:
    """Whether the compiled layer takes this step (else the caller runs the Python path)."""
    if metadata.paged is None or not _takes(x, hidden, positions, kv_cache, metadata.slot_mapping):
        return False
    return max_rows is None or x.shape[0] <= max_rows


def _start_step(
    step: _Step, x: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
    scale: float, scratch_per_token: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Point `step` at x, a new output and scratch, the positions, slots and attention arguments.

    Returns the output and the scratch: the caller holds both (as locals) until the compiled call returns.
    """
    m = x.shape[0]
    out, scratch = torch.empty_like(x), torch.empty(m * scratch_per_token)
    step.m, step.x, step.out, step.scratch = m, x.data_ptr(), out.data_ptr(), scratch.data_ptr()
    step.positions, step.slots = positions.data_ptr(), metadata.slot_mapping.data_ptr()
    _fill_attention(step.attention, kv_cache, metadata, scale)
    return out, scratch


def _check_status(status: int) -> None:
    if status == -1:
        raise ValueError("a position is outside the rotary tables: raise max_position_embeddings")
    if status != 0:
        raise RuntimeError(f"fused paged attention failed (status {status})")


def _takes(x: torch.Tensor, hidden: int, positions: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> bool:
    return (
        x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous() and x.dim() == 2 and x.shape[1] == hidden
        and kv_cache.dtype in CACHE_DTYPES and kv_cache.device.type == "cpu" and kv_cache.is_contiguous()
        and positions.dtype == torch.int64 and positions.is_contiguous() and positions.shape == (x.shape[0],)
        and slots.dtype == torch.int64 and slots.is_contiguous() and slots.shape == (x.shape[0],)
    )  # fmt: skip


def _fill_attention(args: AttentionArgs, kv_cache: torch.Tensor, metadata: AttentionMetadata, scale: float) -> None:
    """The step's part of the attention arguments (the layer fills the shapes and buffers)."""
    paged = metadata.paged
    keys = kv_cache.data_ptr()
    args.keys, args.values = keys, keys + kv_cache.stride(0) * kv_cache.element_size()
    args.block_size = kv_cache.shape[2]
    args.cache_format = CACHE_FORMATS[kv_cache.dtype]
    args.block_tables, args.query_starts = paged.block_tables.data_ptr(), paged.query_starts.data_ptr()
    args.query_counts, args.context_lens = paged.query_counts.data_ptr(), paged.context_lens.data_ptr()
    args.num_seqs, args.max_blocks = paged.block_tables.shape[0], paged.block_tables.shape[1]
    args.scale, args.softcap, args.window = scale, 0.0, metadata.sliding_window or 0
    args.span_masks = span_masks_pointer(paged)
