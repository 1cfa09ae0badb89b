"""Linear and embedding layers over GGML blocks: the weight stays quantized in memory.

Products with a few rows (decode) go through the compiled GEMV, which dequantizes in registers;
more rows (prefill) dequantize the weight a tile of rows at a time to float32 and use torch's
GEMM, where the product is compute-bound and the dequantization cost is shared by every row.
Without the compiled kernels both fall back to the plain-torch decoder and `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.quant.ggml_blocks import GGMLTensor, dequantize_torch
from ember.quant.ggml_kernels import MAX_GEMV_ROWS, load_kernels

TILE_VALUES = 1 << 22  # dequantize at most 4M values (16 MB of float32) at a time in the many-row path


def ggml_linear(x: torch.Tensor, weight: GGMLTensor, bias: torch.Tensor | None, tile_values: int = TILE_VALUES) -> torch.Tensor:
    """x [m, cols] @ weight.T + bias in float32, the weight dequantized on the fly (`tile_values` at a time for many rows)."""
    kernels = load_kernels()
    x = x.float()
    if kernels is None:
        return F.linear(x, dequantize_torch(weight.data, weight.format).reshape(weight.shape), bias)
    if x.shape[0] <= MAX_GEMV_ROWS:
        return kernels.gemv(x, weight, bias)
    rows, cols = weight.shape
    tile_rows = max(1, tile_values // cols)
    if rows <= tile_rows:
        return F.linear(x, kernels.dequantize(weight), bias)
    out = torch.empty(x.shape[0], rows, dtype=torch.float32)
    for start in range(0, rows, tile_rows):
        tile = GGMLTensor(weight.data[start : start + tile_rows], weight.format, cols)
        out[:, start : start + tile_rows] = x @ kernels.dequantize(tile).t()
    return out if bias is None else out + bias


class GGMLLinear(nn.Module):
    """`y = x W^T + b` with W in GGML blocks (a non-persistent buffer: state dicts never carry it)."""

    def __init__(self, weight: GGMLTensor, bias: nn.Parameter | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.format = weight.format
        self.register_buffer("qweight", weight.data, persistent=False)
        self.bias = bias

    @property
    def weight_blocks(self) -> GGMLTensor:
        return GGMLTensor(self.qweight, self.format, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = ggml_linear(flat, self.weight_blocks, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format.name}, bias={self.bias is not None}"


class GGMLEmbedding(nn.Module):
    """Token embedding over GGML blocks: the looked-up rows are dequantized, the table never is."""

    def __init__(self, weight: GGMLTensor) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.format = weight.format
        self.register_buffer("qweight", weight.data, persistent=False)

    @property
    def weight_blocks(self) -> GGMLTensor:
        return GGMLTensor(self.qweight, self.format, self.embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight_blocks.rows(input_ids.reshape(-1)).dequantize()
        return rows.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.format.name}"


def can_hold_blocks(module: nn.Module) -> bool:
    """Whether `module` has a GGML counterpart (a linear or embedding layer)."""
    return isinstance(module, (nn.Linear, nn.Embedding))


def install_ggml_layers(model: nn.Module, weights: dict[str, GGMLTensor]) -> None:
    """Swap each `<module>.weight` named in `weights` for a layer over its blocks; a linear keeps its bias parameter."""
    for name, weight in weights.items():
        module_path = name.removesuffix(".weight")
        parent_path, _, child = module_path.rpartition(".")
        old = model.get_submodule(module_path)
        if isinstance(old, nn.Linear):
            new: nn.Module = GGMLLinear(weight, old.bias)
        elif isinstance(old, nn.Embedding):
            new = GGMLEmbedding(weight)
        else:
            raise ValueError(f"{module_path} is a {type(old).__name__}, which cannot run GGML blocks; load with --dtype float32")
        setattr(model.get_submodule(parent_path), child, new)
