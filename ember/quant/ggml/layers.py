"""Linear and embedding layers over GGML blocks: the weight stays quantized in memory.

A layer computes W . r(x), where r rounds x to int8 per 32 values (`activations="int8"`, the
default where the kernels have the int8 path; each value moves by at most max|x_block| / 254) or
leaves it (`"float32"`: exact up to float32 summation order, e.g. to hold the quantized model to
its dequantized float copy token for token). Products with up to MAX_PASS_ROWS rows (decode
batches) go through the compiled GEMV, which dequantizes in registers and, for int8, runs integer
dot products, MAX_GEMV_ROWS rows per pass over the weight; so do int8 products of any size where the CPU
has VNNI (`GGMLKernels.runs_in_passes`: the passes win at every size there). Otherwise more rows (prefill) round x
the same way, then dequantize the weight a tile of rows at a time to float32 and use ember's packed GEMM (torch's
without it), where the product is compute-bound and the dequantization and packing cost is shared by every row.
Both paths round x the same way, so they agree up to float32 summation order; bit for bit
a row's result depends only on its own values within one path: a step that takes the tiles
gives its rows other last bits than a small step does, which later layers' int8 rounding can grow
into a different greedy choice. Without the compiled kernels everything falls back
to the plain-torch decoder, float32 activations and `F.linear`.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from ember.layers.cpu_decoder_layer import CompilableLayer
from ember.layers.cpu_gemm import CompiledProduct, PackedWeight, load_gemm
from ember.layers.linear import DenseLinear
from ember.layers.parallel import JoinsSlices
from ember.quant.choices import QUANT_ACTIVATIONS
from ember.quant.ggml.blocks import GGMLRowParts, GGMLTensor, dequantize_torch
from ember.quant.ggml.interleave import ROWS_PER_GROUP, can_interleave, interleaved, plain, rows_of
from ember.quant.ggml.kernels import (
    GEMV_PATHS,
    MAX_PASS_ROWS,
    GGMLWeightPointer,
    RowPartsPointer,
    load_kernels,
)
from ember.quant.ggml.zero_point import ZeroPointTensor
from ember.quant.int8.channel import Int8ChannelTensor
from ember.quant.int8.exact_top_logits import BFLOAT16_UNIT_ROUNDOFF, refine_near_top, row_norms
from ember.quant.int8.w8a8_layers import W8A8Linear

# The many-row path dequantizes at most this many values (1 MB of float32) at a time: the tile is still in L2 when it
# is packed and multiplied. Measured at 128 and 512 rows on Q4_1 / Q5_0 / Q4_K / Q8_0 layer shapes of SmolLM2 and
# Qwen2.5: 1.1-4.6x faster than 4M-value tiles, whose fresh 16 MB buffers cost more than the product.
TILE_VALUES = 1 << 18
ACTIVATIONS = QUANT_ACTIVATIONS  # "int8", "float32": EngineConfig.quant_activations picks one per engine
# The output projection (named so by every ember family, as in transformers). Over plain GGML blocks it is a
# `GGMLLogitsLinear`: int8 activations, float32-exact where a logit could be its row's largest (int8 rounding of its
# input moves logits by up to ~0.5 on SmolLM2, enough to flip near-ties a small model's greedy choice rests on). Its
# other kinds (GPTQ / AWQ offsets, row parts) keep float32 activations.
LOGITS_MODULE = "lm_head"


def ggml_linear(
    x: torch.Tensor, weight: GGMLTensor, bias: torch.Tensor | None, tile_values: int = TILE_VALUES, activations: str = "int8",
    tiles: bool | None = None,
) -> torch.Tensor:
    """r(x) [m, cols] @ weight.T + bias in float32, the weight dequantized on the fly (`tile_values` at a time for many rows).

    `activations`: "int8" (r rounds per 32 values where the kernels have that path) or "float32" (r is the identity).
    `tiles`: True takes the dequantized tiles, False the GEMV passes; None whichever this CPU runs faster at x's rows."""
    kernels = load_kernels()
    x = x.float()
    if kernels is None:
        return F.linear(x, dequantize_torch(weight.data, weight.format).reshape(weight.shape), bias)
    rows, cols = weight.shape
    path = kernels.format_path(weight.format, activations)
    use_tiles = not kernels.runs_in_passes(path, x.shape[0]) if tiles is None else tiles
    if not use_tiles:
        return kernels.gemv_blocks(x, weight.data, weight.format.type_id, bias, rows, cols, path)
    if path == GEMV_PATHS.index("int8"):
        x = round_to_int8_blocks(x)
    tile_rows = max(ROWS_PER_GROUP, tile_values // cols // ROWS_PER_GROUP * ROWS_PER_GROUP)  # whole interleaved groups
    if rows <= tile_rows:
        out = _times_tile(x, kernels.dequantize(weight))
    else:
        out = torch.empty(x.shape[0], rows, dtype=torch.float32)
        for start in range(0, rows, tile_rows):
            tile = kernels.dequantize(GGMLTensor(weight.data[start : start + tile_rows], weight.format, cols))
            out[:, start : start + tile_rows] = _times_tile(x, tile)
    return out if bias is None else out + bias


def _times_tile(x: torch.Tensor, tile: torch.Tensor) -> torch.Tensor:
    """x @ tile.T for a dequantized float32 tile: ember's packed GEMM where it is built (1.2-1.9x torch's mm on
    prefill shapes here, packing included: packing is one pass over the tile, the product m passes), else torch's."""
    gemm = load_gemm()
    return x @ tile.t() if gemm is None else gemm(x, PackedWeight.from_dense(tile))


def round_to_int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """x [m, cols] rounded as the int8 kernel rounds it: per 32 values d = max|x| / 127, d * round-half-even(x / d)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    return (torch.round(blocks * inverse) * d).reshape(x.shape)


class GGMLLinear(nn.Module):
    """`y = x W^T + b` with W in GGML blocks (a non-persistent buffer: state dicts never carry it).

    `activations` ("int8" or "float32") is the precision the few-row kernel rounds x to. A Q4_0 / Q4_1 / Q5_0 / Q5_1 /
    Q8_0 / Q4_K / Q5_K / Q6_K weight of a layer built for int8 activations is held in its eight-row interleaved layout (ember.quant.ggml.interleave:
    the same bytes moved, ~3x fewer instructions per block in the int8 product); `weight_blocks` gives the GGUF
    layout back."""

    def __init__(self, weight: GGMLTensor, bias: nn.Parameter | None = None, activations: str = "int8") -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.activations = _checked_activations(activations)
        weight = _kernel_layout(weight, self.activations)
        self.format = weight.format
        self.register_buffer("qweight", weight.data, persistent=False)
        self.bias = bias

    @property
    def weight_blocks(self) -> GGMLTensor:
        """The weight in its GGUF layout (a copy when the layer holds it interleaved)."""
        return plain(self.stored_blocks)

    @property
    def stored_blocks(self) -> GGMLTensor:
        """The weight as the layer holds it (the kernels take either layout)."""
        return GGMLTensor(self.qweight, self.format, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        kernels = load_kernels()
        path = None if kernels is None else kernels.format_path(self.format, self.activations)
        if path is not None and kernels.runs_in_passes(path, flat.shape[0]):  # decode: straight to the kernel (per-call cost matters)
            out = kernels.gemv_blocks(flat, self.qweight, self.format.type_id, self.bias, self.out_features, self.in_features, path)
        else:
            out = ggml_linear(flat, self.stored_blocks, self.bias, activations=self.activations)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def compiled_product(self) -> CompiledProduct | None:
        """This layer's product for C callers such as the compiled decoder layer: up to MAX_PASS_ROWS rows,
        row by row as decode computes them (same bits); more rows go through `forward` (passes or tiles). The
        product reads `qweight` and `activations` as they are now: drop it before changing either.
        None without the compiled kernels."""
        kernels = load_kernels()
        if kernels is None:
            return None
        weight = GGMLWeightPointer(self.format.type_id, kernels.format_path(self.format, self.activations), self.qweight.data_ptr())
        bias = None if self.bias is None else self.bias.detach().float().contiguous()
        return CompiledProduct(
            kernels.linear_address, ctypes.addressof(weight), None if bias is None else bias.data_ptr(),
            self.in_features, MAX_PASS_ROWS, (weight, bias, self.qweight),
        )

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self.format.name}, "
                f"activations={self.activations}, bias={self.bias is not None}")


class GGMLLogitsLinear(GGMLLinear):
    """The LM head over GGML blocks: with int8 activations, every logit that could be its row's largest is recomputed
    with float32 activations (ember.quant.int8.exact_top_logits), so greedy choices are the float32 product's while the
    whole product runs at int8 speed. `row_norms` (||w_j||, float32) bound each logit's rounding error."""

    def __init__(self, weight: GGMLTensor, bias: nn.Parameter | None = None, activations: str = "int8") -> None:
        super().__init__(weight, bias, activations)
        norms = row_norms(lambda start, stop: GGMLTensor(weight.data[start:stop], weight.format, weight.cols).dequantize(),
                          weight.shape[0])
        self.register_buffer("row_norms", norms, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        logits = super().forward(flat)  # float32 [rows, vocab], refined in place
        kernels = load_kernels()
        path = None if kernels is None else kernels.format_path(self.format, self.activations)
        if path == GEMV_PATHS.index("int8"):
            on_tiles = kernels.on_tiles(path, flat.shape[0])  # AMX: x and the weights rounded to bfloat16
            rounded = flat.bfloat16().float() if on_tiles else round_to_int8_blocks(flat)
            refine_near_top(logits, flat, rounded, self.row_norms, self._exact, BFLOAT16_UNIT_ROUNDOFF if on_tiles else 0.0)
        logits = logits.view(*x.shape[:-1], self.out_features)
        return logits if logits.dtype == x.dtype else logits.to(x.dtype)

    def _exact(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Logits [m, len(ids)] of tokens `ids` for x [m, cols] with float32 activations, as the float32 head computes
        them (GEMV passes: each output's bits depend only on its own row and x's)."""
        bias = None if self.bias is None else self.bias.detach().float()[ids]
        return ggml_linear(x, rows_of(self.stored_blocks, ids), bias, activations="float32", tiles=False)


class ZeroPointLinear(GGMLLinear):
    """A GPTQ / AWQ weight (ember.quant.ggml.zero_point): x's columns gathered into the blocks' order, the blocks'
    product, plus each group's sum of x times the group's offsets. Up to MAX_PASS_ROWS rows one compiled call
    (`ember_ggml_linear`, also the compiled decoder layer's product: same bits); more rows in torch around
    `ggml_linear`'s tiles."""

    def __init__(self, weight: ZeroPointTensor, bias: nn.Parameter | None = None, activations: str = "int8") -> None:
        super().__init__(weight.blocks, bias, activations)
        self.num_groups = 0 if weight.offsets is None else weight.offsets.shape[1]
        # [groups, rows]: the C kernel adds one group's offsets to a whole output row at a time
        offsets_by_group = None if weight.offsets is None else weight.offsets.t().contiguous()
        self.register_buffer("offsets_by_group", offsets_by_group, persistent=False)
        self.register_buffer("column_groups", weight.column_groups, persistent=False)
        self.register_buffer("input_order", weight.input_order, persistent=False)

    @property
    def weight_tensor(self) -> ZeroPointTensor:
        offsets = None if self.offsets_by_group is None else self.offsets_by_group.t().contiguous()
        return ZeroPointTensor(self.weight_blocks, offsets, self.column_groups, self.input_order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        kernels = load_kernels()
        bias = None if self.bias is None else self.bias.float()
        if kernels is not None and kernels.runs_in_passes(kernels.format_path(self.format, self.activations), flat.shape[0]):
            out = kernels.linear(flat.contiguous(), self._weight_pointer(kernels), bias, self.out_features)
        else:
            out = self._forward_torch(flat, bias)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def _forward_torch(self, flat: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.input_order is not None:
            flat = flat.index_select(1, self.input_order)
        out = ggml_linear(flat, self.stored_blocks, bias, activations=self.activations)
        if self.offsets_by_group is None:
            return out
        group_sums = torch.zeros(flat.shape[0], self.num_groups).index_add_(1, self.column_groups, flat)
        return out + group_sums @ self.offsets_by_group

    def _weight_pointer(self, kernels) -> GGMLWeightPointer:
        return GGMLWeightPointer(
            self.format.type_id, kernels.format_path(self.format, self.activations), self.qweight.data_ptr(),
            None if self.input_order is None else self.input_order.data_ptr(),
            None if self.offsets_by_group is None else self.offsets_by_group.data_ptr(),
            self.column_groups.data_ptr(), self.num_groups,
        )

    def compiled_product(self) -> CompiledProduct | None:
        """`ember_ggml_linear` over this weight for C callers (as `GGMLLinear.compiled_product`); None without the kernels."""
        kernels = load_kernels()
        if kernels is None:
            return None
        weight = self._weight_pointer(kernels)
        bias = None if self.bias is None else self.bias.detach().float().contiguous()
        owner = (weight, bias, self.qweight, self.offsets_by_group, self.column_groups, self.input_order)
        return CompiledProduct(kernels.linear_address, ctypes.addressof(weight), None if bias is None else bias.data_ptr(),
                               self.in_features, MAX_PASS_ROWS, owner)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, groups={self.num_groups}, reordered={self.input_order is not None}"


class GGMLRowPartsLinear(nn.Module):
    """`y = x W^T + b` with W's row ranges in different GGML formats (`GGMLRowParts`): one `GGMLLinear` per part, their
    outputs side by side. For C callers one product (`ember_ggml_linear` over a `row_parts` weight) runs each part's
    kernel in turn."""

    def __init__(self, weight: GGMLRowParts, bias: nn.Parameter | None = None, activations: str = "int8") -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.parts = nn.ModuleList(GGMLLinear(part, None, activations) for part in weight.parts)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat([part(x) for part in self.parts], dim=-1)
        return out if self.bias is None else out + self.bias.to(out.dtype)

    def compiled_product(self) -> CompiledProduct | None:
        """The parts' products as one (see `GGMLLinear.compiled_product`); None without the kernels."""
        kernels = load_kernels()
        products = [part.compiled_product() for part in self.parts]
        if kernels is None or None in products:
            return None
        parts = RowPartsPointer(len(products))
        for j, (part, product) in enumerate(zip(self.parts, products, strict=True)):
            parts.weights[j], parts.rows[j] = product.weight, part.out_features
        weight = GGMLWeightPointer(row_parts=ctypes.addressof(parts))
        bias = None if self.bias is None else self.bias.detach().float().contiguous()
        return CompiledProduct(kernels.linear_address, ctypes.addressof(weight), None if bias is None else bias.data_ptr(),
                               self.in_features, MAX_PASS_ROWS, (weight, parts, bias, products))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class GGMLEmbedding(nn.Module):
    """Token embedding over GGML blocks: the looked-up rows are dequantized, the table never is."""

    def __init__(self, weight: GGMLTensor) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.format = weight.format
        self.register_buffer("qweight", weight.data, persistent=False)

    @property
    def weight_blocks(self) -> GGMLTensor:
        """The table in its GGUF layout (a copy when it is held interleaved)."""
        return plain(self.stored_blocks)

    @property
    def stored_blocks(self) -> GGMLTensor:
        return GGMLTensor(self.qweight, self.format, self.embedding_dim)

    def share_blocks(self, blocks: GGMLTensor) -> None:
        """Read the table from `blocks` (the same table in either layout, e.g. a tied LM head's) instead of its own copy."""
        if blocks.shape != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"an embedding of {self.num_embeddings} x {self.embedding_dim} cannot read a {list(blocks.shape)} table")
        self.qweight = blocks.data
        self.format = blocks.format

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = rows_of(self.stored_blocks, input_ids.reshape(-1)).dequantize()
        return rows.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.format.name}"


def _kernel_layout(weight: GGMLTensor, activations: str) -> GGMLTensor:
    """`weight` interleaved where the int8 kernel runs it (built with that path, int8 activations, Q4 / Q5 / Q8_0 /
    Q4_K / Q5_K / Q6_K in groups of eight rows); as it is otherwise."""
    kernels = load_kernels()
    if kernels is None or "int8" not in kernels.paths or activations != "int8" or not can_interleave(weight):
        return weight
    return interleaved(weight)


def _checked_activations(activations: str) -> str:
    if activations not in ACTIVATIONS:
        raise ValueError(f"GGML layer activations {activations!r} are not available; choose one of {', '.join(ACTIVATIONS)}")
    return activations


def activations_for(module_path: str, activations: str, exact_top: bool = False) -> str:
    """The precision the layer at `module_path` uses under the model-wide `activations`: an LM head that does not make
    its top logits exact (`exact_top`: a `GGMLLogitsLinear` does) stays float32."""
    is_head = module_path == LOGITS_MODULE or module_path.startswith(f"{LOGITS_MODULE}.")  # or a parallel head's local product
    return "float32" if is_head and not exact_top else _checked_activations(activations)


def set_activations(model: nn.Module, activations: str) -> int:
    """Set the GGML linear layers of `model` to `activations` (see `activations_for`); returns how many layers.

    Compiled decoder layers hold their products' activation setting: they are rebuilt when it changes."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, GGMLLinear)]
    changed = False
    for name, layer in layers:
        wanted = activations_for(name, activations, isinstance(layer, GGMLLogitsLinear))
        changed |= layer.activations != wanted
        layer.activations = wanted
    if changed:
        for module in model.modules():
            if isinstance(module, CompilableLayer) and module.drop_compiled():
                module.compile_for_cpu()
    return len(layers)


def can_hold_blocks(module: nn.Module) -> bool:
    """Whether `module` has a GGML counterpart (a linear or embedding layer whose weight nothing reads as a matrix)."""
    return isinstance(module, (nn.Linear, nn.Embedding)) and not isinstance(module, DenseLinear)


def install_ggml_layers(model: nn.Module, weights: dict[str, GGMLTensor | GGMLRowParts | Int8ChannelTensor | ZeroPointTensor]) -> None:
    """Swap each `<module>.weight` named in `weights` for a layer over its blocks (or W8A8 int8 rows, or GPTQ / AWQ
    groups with zero points); a linear keeps its bias. Layers given one tensor (a tied table) share one copy of it.
    A tensor-parallel layer (`JoinsSlices`) keeps its collectives around the quantized layer of its slice."""
    built_from: dict[int, list[nn.Module]] = {}
    for name, weight in weights.items():
        built_from.setdefault(id(weight), [])
        module_path = name.removesuffix(".weight")
        parent_path, _, child = module_path.rpartition(".")
        old = model.get_submodule(module_path)
        if isinstance(weight, ZeroPointTensor):
            weight = weight.simplified()
        if isinstance(weight, ZeroPointTensor):
            if not isinstance(old, nn.Linear):
                raise ValueError(f"{module_path} is a {type(old).__name__}; GPTQ / AWQ weights run only in linear layers: load with --dtype float32")
            new: nn.Module = ZeroPointLinear(weight, old.bias, activations=activations_for(module_path, "int8"))
        elif isinstance(weight, Int8ChannelTensor):
            if not isinstance(old, nn.Linear):
                raise ValueError(f"{module_path} is a {type(old).__name__}; W8A8 rows run only in linear layers: load with --dtype float32")
            new = W8A8Linear(weight, old.bias)
        elif isinstance(weight, GGMLRowParts):
            if not isinstance(old, nn.Linear):
                raise ValueError(f"{module_path} is a {type(old).__name__}; GGML row parts run only in linear layers: load with --dtype float32")
            new = GGMLRowPartsLinear(weight, old.bias, activations=activations_for(module_path, "int8"))
        elif isinstance(old, nn.Linear):
            kind = GGMLLogitsLinear if module_path == LOGITS_MODULE else GGMLLinear
            new = kind(weight, old.bias, activations=activations_for(module_path, "int8", kind is GGMLLogitsLinear))
        elif isinstance(old, nn.Embedding):
            new = GGMLEmbedding(weight)
        else:
            raise ValueError(f"{module_path} is a {type(old).__name__}, which cannot run GGML blocks; load with --dtype float32")
        built_from[id(weights[name])].append(new)
        setattr(model.get_submodule(parent_path), child, old.joining(new) if isinstance(old, JoinsSlices) else new)
    for layers in built_from.values():
        _share_tied_table(layers)


def _share_tied_table(layers: list[nn.Module]) -> None:
    """Layers built from one tied table: the embedding reads the LM head's blocks in the layout the head keeps them
    (interleaved for its int8 product), so the table is in memory once."""
    heads = [layer for layer in layers if type(layer) in (GGMLLinear, GGMLLogitsLinear)]
    for embedding in (layer for layer in layers if isinstance(layer, GGMLEmbedding)):
        if heads:
            embedding.share_blocks(heads[0].stored_blocks)
