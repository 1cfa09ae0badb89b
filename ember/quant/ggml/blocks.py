"""GGML block formats kept as they are in the file: a weight is rows of blocks, dequantized on use.

ember executes Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K without a float copy of the model. A
`GGMLTensor` holds the raw bytes of a 2-D weight as a uint8 tensor [rows, bytes_per_row]:
each row is a run of whole blocks, so stacking parts of a fused projection (q, k, v) is a
concatenation of rows, and llama.cpp's row permutation of q/k is a row reindexing.

`dequantize_torch` is the plain-torch decoder (the fallback where no C compiler exists and the
reference the compiled kernels are held to); it repeats the `gguf` package's arithmetic step by
step, so its output is bit-exact with `gguf.quants.dequantize`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ember.quant.ggml.kernels import load_kernels


@dataclass(frozen=True)
class GGMLFormat:
    """One block format: its GGML type id, values per block and bytes per block."""

    name: str
    type_id: int
    block_values: int
    block_bytes: int
    has_int8_kernel: bool = True  # integer codes: the decode product can run on int8 activations

    @property
    def bits_per_value(self) -> float:
        return 8.0 * self.block_bytes / self.block_values


FORMATS: dict[str, GGMLFormat] = {
    f.name: f
    for f in (
        GGMLFormat("Q4_0", 2, 32, 18),
        GGMLFormat("Q4_1", 3, 32, 20),
        GGMLFormat("Q5_0", 6, 32, 22),  # fp16 d, 32 high bits, 16 bytes of low nibbles: d * (q - 16)
        GGMLFormat("Q5_1", 7, 32, 24),  # fp16 d and m, the same 5-bit codes: d * q + m
        GGMLFormat("Q8_0", 8, 32, 34),
        GGMLFormat("Q2_K", 10, 256, 84),  # 16 scale/min nibble pairs, 64 bytes of 2-bit codes, fp16 d and dmin
        GGMLFormat("Q3_K", 11, 256, 110),  # 32 bytes of high bits, 64 bytes of low 2 bits, 12 bytes of 6-bit scales, fp16 d
        GGMLFormat("Q4_K", 12, 256, 144),
        GGMLFormat("Q5_K", 13, 256, 176),
        GGMLFormat("Q6_K", 14, 256, 210),
        # ember's own (type ids outside GGML's): float codes, so products keep float32 activations.
        GGMLFormat("NF4", 200, 64, 34, has_int8_kernel=False),  # fp16 absmax scale + 64 NormalFloat-4 codes
        GGMLFormat("FP8", 201, 32, 33, has_int8_kernel=False),  # E8M0 scale + 32 e4m3 codes (OCP MXFP8's block)
    )
}
GGUF_FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # the formats GGML itself defines
# QLoRA's NormalFloat-4 levels (the bitsandbytes constants), code 0..15.
NF4_LEVELS = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635, -0.18477343022823334,
    -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)

SCALE_FIELD_BYTES = {"Q4_0": 2, "Q4_1": 4, "Q5_0": 2, "Q5_1": 4, "Q8_0": 2}  # the fp16 scale (and min) that lead each 32-value block


class GGMLTensor:
    """A 2-D weight [rows, cols] stored as GGML blocks: `data` is uint8 [rows, cols // block_values * block_bytes]."""

    def __init__(self, data: torch.Tensor, format: GGMLFormat, cols: int) -> None:
        if cols % format.block_values:
            raise ValueError(
                f"a {format.name} weight needs rows of whole {format.block_values}-value blocks; got {cols} columns"
            )
        row_bytes = cols // format.block_values * format.block_bytes
        if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != row_bytes:
            raise ValueError(f"{format.name} data for {cols} columns must be uint8 [rows, {row_bytes}], got {data.dtype} {tuple(data.shape)}")
        self.data = data.contiguous()
        self.format = format
        self.cols = cols

    @property
    def shape(self) -> tuple[int, int]:
        return (self.data.shape[0], self.cols)

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def rows(self, index: torch.Tensor) -> GGMLTensor:
        """The rows at `index` (an embedding lookup, a row permutation), still in blocks."""
        _require_gguf_layout(self.format)
        return GGMLTensor(self.data.index_select(0, index), self.format, self.cols)

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, cols], bit-exact with the `gguf` package."""
        kernels = load_kernels()
        if kernels is None:
            return dequantize_torch(self.data, self.format).reshape(self.shape)
        return kernels.dequantize(self)

    def scale_group_size(self) -> int:
        """Columns that share one set of scale fields: for Q4_0/Q4_1/Q8_0 the longest run of 32-value blocks
        (dividing the row) whose fields are equal in every run (a g128 grid repeats them 4 times); else a block."""
        fields = SCALE_FIELD_BYTES.get(self.format.name)
        if fields is None:
            return self.format.block_values
        per_row = self.cols // self.format.block_values
        scales = self.data.reshape(self.data.shape[0], per_row, self.format.block_bytes)[:, :, :fields]
        best = 1
        for run in range(2, per_row + 1):
            if per_row % run == 0:
                grouped = scales.reshape(scales.shape[0], per_row // run, run, fields)
                if bool((grouped == grouped[:, :, :1]).all()):
                    best = run
        return best * self.format.block_values

    def nominal_bytes(self) -> float:
        """Bytes of the codes plus one set of scale fields per `scale_group_size()` columns: what a layout
        storing each group's scales once would take (the blocks in memory repeat them every 32 values)."""
        fields = SCALE_FIELD_BYTES.get(self.format.name)
        if fields is None:
            return float(self.nbytes)
        code_bytes = (self.format.block_bytes - fields) / self.format.block_values
        values = self.shape[0] * self.shape[1]
        return values * code_bytes + values / self.scale_group_size() * fields

    @staticmethod
    def concat(parts: list[GGMLTensor]) -> GGMLTensor:
        """Rows of `parts` stacked in order (a fused projection); every part must share format and width."""
        first = parts[0]
        if any(p.format != first.format or p.cols != first.cols for p in parts):
            raise ValueError("fused GGML parts must share one format and width; " + ", ".join(f"{p.format.name}{list(p.shape)}" for p in parts))
        return GGMLTensor(torch.cat([p.data for p in parts], dim=0), first.format, first.cols)


class GGMLRowParts:
    """A weight whose row ranges keep different GGML formats: a fused projection whose parts mix formats that no one
    format holds exactly (a Q4_K_M file's Q4_K q and k with a Q6_K v). Each part stays in its blocks."""

    def __init__(self, parts: list[GGMLTensor]) -> None:
        if len(parts) < 2 or any(p.cols != parts[0].cols for p in parts):
            raise ValueError("row parts are two or more GGML weights of one width; got "
                             + ", ".join(f"{p.format.name}{list(p.shape)}" for p in parts))
        self.parts = tuple(parts)

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].cols

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, cols]: each part's rows as its format defines them."""
        return torch.cat([p.dequantize() for p in self.parts], dim=0)


# Formats whose value is d * (code - center): each is Q8_0 with the same d and int8 codes, exactly.
SYMMETRIC_32 = {"Q4_0": 8, "Q5_0": 16, "Q8_0": 0}


def as_q8_0(weight: GGMLTensor) -> GGMLTensor:
    """A Q4_0 / Q5_0 / Q8_0 weight as Q8_0 blocks with the same values, bit for bit (the same fp16 d, the codes
    minus their center as int8): lets a fused projection whose parts mix these formats stay quantized."""
    name = weight.format.name
    if name not in SYMMETRIC_32:
        raise ValueError(f"only {', '.join(SYMMETRIC_32)} blocks are Q8_0 blocks exactly; got {name}")
    if name == "Q8_0":
        return weight
    blocks = weight.data.reshape(-1, weight.format.block_bytes)
    codes = (_codes_32(blocks, name) - SYMMETRIC_32[name]).to(torch.int8)
    q8 = torch.cat([blocks[:, :2], codes.view(torch.uint8)], dim=1)
    return GGMLTensor(q8.reshape(weight.shape[0], -1), FORMATS["Q8_0"], weight.cols)


def _codes_32(blocks: torch.Tensor, name: str) -> torch.Tensor:
    """The 32 unsigned codes of each Q4_0 / Q4_1 / Q5_0 / Q5_1 block in value order, int32 [num_blocks, 32]."""
    fields = 2 if name in ("Q4_0", "Q5_0") else 4
    if name in ("Q4_0", "Q4_1"):
        low, up = _nibbles(blocks[:, fields:])
        return torch.cat([low, up], dim=1).to(torch.int32)
    bits = blocks[:, fields : fields + 4].contiguous().view(torch.int32)  # little-endian, as the file stores it
    high = ((bits >> torch.arange(32, dtype=torch.int32)) & 1) << 4  # bit l -> 16 for value l
    low, up = _nibbles(blocks[:, fields + 4 :])
    return torch.cat([low, up], dim=1).to(torch.int32) | high


def _half(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 field at byte `offset` of each block, as float32 [num_blocks, 1]."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return qs & 15, qs >> 4


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 packed bytes -> 8 six-bit scales and 8 six-bit mins per super-block."""
    d, m, m_d = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    scale = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    minimum = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=1)
    return scale, minimum


def _dequantize_32(blocks: torch.Tensor, name: str) -> torch.Tensor:
    d = _half(blocks, 0)
    if name == "Q8_0":
        return blocks[:, 2:].contiguous().view(torch.int8).float() * d
    codes = _codes_32(blocks, name)
    if name in ("Q4_0", "Q5_0"):
        return d * (codes - SYMMETRIC_32[name]).float()
    return d * codes.float() + _half(blocks, 2)  # Q4_1, Q5_1


def _low2(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K / Q3_K: 64 code bytes -> 256 values' low 2 bits [n, 16 groups, 16] (value 128h + 32j + l: byte 32h + l >> 2j)."""
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    return ((qs.reshape(-1, 2, 1, 32) >> shifts) & 3).reshape(-1, 16, 16)


def _dequantize_k_low_bits(blocks: torch.Tensor, name: str) -> torch.Tensor:
    n = blocks.shape[0]
    if name == "Q2_K":
        scales = blocks[:, :16]
        dl = (_half(blocks, 80) * (scales & 15).float()).reshape(n, 16, 1)
        ml = (_half(blocks, 82) * (scales >> 4).float()).reshape(n, 16, 1)
        return (dl * _low2(blocks[:, 16:80]).float() - ml).reshape(n, 256)
    packed = blocks[:, 96:108]
    low = (packed[:, :8].reshape(n, 1, 8) >> torch.tensor([0, 4], dtype=torch.uint8).reshape(1, 2, 1)).reshape(n, 16)
    high = (packed[:, 8:].reshape(n, 1, 4) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 4, 1)).reshape(n, 16)
    scales = (((low & 0x0F) | ((high & 3) << 4)).to(torch.int8) - 32).float()
    dl = (_half(blocks, 108) * scales).reshape(n, 16, 1)
    hbits = (blocks[:, :32].reshape(n, 1, 32) >> torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)).reshape(n, 16, 16) & 1
    q = _low2(blocks[:, 32:96]).to(torch.int8) - ((hbits ^ 1) << 2).to(torch.int8)  # a clear high bit means minus 4
    return (dl * q.float()).reshape(n, 256)


def _dequantize_k(blocks: torch.Tensor, name: str) -> torch.Tensor:
    n = blocks.shape[0]
    if name in ("Q2_K", "Q3_K"):
        return _dequantize_k_low_bits(blocks, name)
    if name == "Q6_K":
        low, high = _nibbles(blocks[:, :128].reshape(n, 2, 1, 64))
        ql = torch.cat([low, high], dim=2).reshape(n, 8, 32)
        qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
        q = ((ql | ((qh.reshape(n, 8, 32) & 3) << 4)).to(torch.int8) - 32).reshape(n, 16, 16).float()
        scale = _half(blocks, 208) * blocks[:, 192:208].contiguous().view(torch.int8).float()
        return (scale.reshape(n, 16, 1) * q).reshape(n, 256)
    scale, minimum = _k_scales(blocks[:, 4:16])
    d = (_half(blocks, 0) * scale.float()).reshape(n, 8, 1)
    dm = (_half(blocks, 2) * minimum.float()).reshape(n, 8, 1)
    qs = blocks[:, 16:144] if name == "Q4_K" else blocks[:, 48:176]
    low, high = _nibbles(qs.reshape(n, 4, 1, 32))
    q = torch.cat([low, high], dim=2).reshape(n, 8, 32)
    if name == "Q5_K":
        qh = blocks[:, 16:48].reshape(n, 1, 32) >> torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)
        q = q | ((qh & 1) << 4)
    return (d * q.float() - dm).reshape(n, 256)


def _dequantize_float_codes(blocks: torch.Tensor, name: str) -> torch.Tensor:
    """NF4: d * level[code] (low nibbles are values 0-31, high 32-63); FP8: e4m3 value * 2^(e - 127)."""
    if name == "NF4":
        low, high = _nibbles(blocks[:, 2:])
        levels = torch.tensor(NF4_LEVELS, dtype=torch.float32)
        return _half(blocks, 0) * levels[torch.cat([low, high], dim=1).long()]
    scale = (blocks[:, :1].to(torch.int32) << 23).view(torch.float32)
    return blocks[:, 1:].contiguous().view(torch.float8_e4m3fn).float() * scale


def dequantize_torch(data: torch.Tensor, format: GGMLFormat) -> torch.Tensor:
    """Blocks -> float32 values, flat; the same operations in the same order as `gguf.quants` (or, for
    NF4/FP8, the C decoder's, with torch's float8_e4m3fn conversion as the e4m3 reference)."""
    _require_gguf_layout(format)
    blocks = data.reshape(-1, format.block_bytes)
    if not format.has_int8_kernel:
        return _dequantize_float_codes(blocks, format.name).reshape(-1)
    if format.block_values == 32:
        return _dequantize_32(blocks, format.name).reshape(-1)
    return _dequantize_k(blocks, format.name).reshape(-1)


def _require_gguf_layout(format: GGMLFormat) -> None:
    if FORMATS.get(format.name) != format:
        raise ValueError(f"{format.name} is a compiled kernel's layout, not a row-per-row block format: take the GGUF layout "
                         "first (ember.quant.ggml.interleave.plain)")
