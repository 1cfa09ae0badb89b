"""Per-channel int8 weights and per-token int8 activations: the arithmetic of W8A8 (SmoothQuant's layer).

A weight W [rows, cols] is stored as int8 codes q with one float32 scale per output channel
(row): W ~ s_w[r] * q[r, :], s_w = max|W[r, :]| / 127, codes in -127..127 (symmetric, so the
sign trick of the AVX2 kernels never meets -128). At run time each token's activations x [cols]
get a scale of their own, s_x = max|x| / 127, and codes round-half-even(x / s_x); the products
of codes are summed exactly (int32: |sum| <= cols * 127^2) and scaled once:
y[t, r] = (acc[t, r] * s_x[t]) * s_w[r] (+ bias). The float operations and their order are fixed
here; the compiled kernel (ember.quant.int8.w8a8_kernels) repeats them, so both give the same bits.

On disk (safetensors uint8, GGUF raw I8 rows) a weight is one row of bytes per output channel:
its float32 scale (little-endian) then its `cols` int8 codes: `Int8ChannelTensor.stored()`.
"""

from __future__ import annotations

import torch

FORMAT_NAME = "W8A8"  # the name ember_quantization.json and the GGUF key ember.block_formats give these rows
SCALE_BYTES = 4
MAX_CODE = 127
EXACT_FLOAT_COLUMNS = 1024  # 1024 * 127^2 < 2^24: float32 sums of this many code products are exact


class Int8ChannelTensor:
    """A weight [rows, cols] as int8 codes [rows, cols] and float32 scales [rows]: value = scales[r] * codes[r, c]."""

    format_name = FORMAT_NAME

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        if codes.dtype != torch.int8 or codes.dim() != 2:
            raise ValueError(f"W8A8 codes must be int8 [rows, cols], got {codes.dtype} {tuple(codes.shape)}")
        if scales.dtype != torch.float32 or tuple(scales.shape) != (codes.shape[0],):
            raise ValueError(f"W8A8 scales must be float32 [{codes.shape[0]}], got {scales.dtype} {tuple(scales.shape)}")
        self.codes = codes.contiguous()
        self.scales = scales.contiguous()

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1])

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + self.scales.numel() * SCALE_BYTES

    def nominal_bytes(self) -> float:
        return float(self.nbytes)

    def rows(self, index: torch.Tensor) -> Int8ChannelTensor:
        """The rows at `index` (a row permutation, a slice of a fused projection), still int8."""
        return Int8ChannelTensor(self.codes.index_select(0, index), self.scales.index_select(0, index))

    def row_range(self, start: int, stop: int) -> Int8ChannelTensor:
        return Int8ChannelTensor(self.codes[start:stop], self.scales[start:stop])

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, cols]: scales[r] * codes[r, c] (exact in float32)."""
        return self.codes.float() * self.scales.unsqueeze(1)

    def stored(self) -> torch.Tensor:
        """uint8 [rows, 4 + cols]: each row's float32 scale bytes, then its codes."""
        return torch.cat([self.scales.reshape(-1, 1).view(torch.uint8), self.codes.view(torch.uint8)], dim=1)

    @classmethod
    def from_stored(cls, raw: torch.Tensor) -> Int8ChannelTensor:
        """The inverse of `stored()` (copies the codes into their own contiguous tensor)."""
        if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] <= SCALE_BYTES:
            raise ValueError(f"stored W8A8 rows must be uint8 [rows, 4 + cols], got {raw.dtype} {tuple(raw.shape)}")
        scales = raw[:, :SCALE_BYTES].contiguous().view(torch.float32).reshape(-1)
        return cls(raw[:, SCALE_BYTES:].contiguous().view(torch.int8), scales.clone())

    @staticmethod
    def concat(parts: list[Int8ChannelTensor]) -> Int8ChannelTensor:
        """Rows of `parts` stacked in order (a fused projection); every part must have the same width."""
        if len({p.shape[1] for p in parts}) != 1:
            raise ValueError("fused W8A8 parts must share one width; got " + ", ".join(str(list(p.shape)) for p in parts))
        return Int8ChannelTensor(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]))


def quantize_weight(weight: torch.Tensor) -> Int8ChannelTensor:
    """Symmetric int8 per output channel: scale = max|row| / 127, codes = round-half-even(row / scale)."""
    weight = weight.detach().float()
    scales = weight.abs().amax(dim=1) / MAX_CODE
    return Int8ChannelTensor(_codes(weight, scales.unsqueeze(1)), scales)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (row) symmetric int8 of x [m, cols] float32: (codes int8 [m, cols], scales float32 [m, 1])."""
    scales = x.abs().amax(dim=1, keepdim=True) / MAX_CODE
    return _codes(x, scales), scales


def _codes(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """round-half-even(values * (1 / scale)) clamped to +-127; a zero scale gives zero codes."""
    inverse = torch.where(scales != 0, 1.0 / scales, torch.zeros_like(scales))
    return torch.round(values * inverse).clamp(-MAX_CODE, MAX_CODE).to(torch.int8)


def int8_products(x_codes: torch.Tensor, w_codes: torch.Tensor) -> torch.Tensor:
    """int32 [m, rows] = x_codes [m, cols] . w_codes [rows, cols]^T, exactly, through torch's float32 GEMM.

    Each product of codes is an integer of magnitude <= 127^2, so a float32 sum of up to
    EXACT_FLOAT_COLUMNS of them never leaves the integers float32 holds exactly (< 2^24), in any
    summation order; the column chunks' sums are then added in int32. On CPUs without int8 GEMM
    kernels this is 2-20x faster than `torch._int_mm` (ember bench quant's W8A8 table)."""
    out = torch.zeros(x_codes.shape[0], w_codes.shape[0], dtype=torch.int32)
    for start in range(0, x_codes.shape[1], EXACT_FLOAT_COLUMNS):
        stop = start + EXACT_FLOAT_COLUMNS
        out += (x_codes[:, start:stop].float() @ w_codes[:, start:stop].float().t()).to(torch.int32)
    return out


def int8_products_int_mm(x_codes: torch.Tensor, w_codes: torch.Tensor) -> torch.Tensor:
    """The same int32 products through `torch._int_mm` (integer accumulation): a reference and a timed peer."""
    return torch._int_mm(x_codes, w_codes.t())


def scale_products(acc: torch.Tensor, x_scales: torch.Tensor, w_scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float32 y = (acc * s_x) * s_w (+ bias): the order the compiled kernel uses too."""
    out = acc.float() * x_scales * w_scales
    return out if bias is None else out + bias


def w8a8_linear_torch(x: torch.Tensor, weight: Int8ChannelTensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The plain-torch W8A8 product of x [m, cols] float32: per-token int8, exact integer sums, then scales."""
    x_codes, x_scales = quantize_tokens(x)
    return scale_products(int8_products(x_codes, weight.codes), x_scales, weight.scales, bias)
