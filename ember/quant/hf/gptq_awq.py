"""HF checkpoints quantized by AutoGPTQ / GPTQModel or AutoAWQ, read into ember's quantized layers.

transformers finds these by `quantization_config` in config.json. Each quantized linear `<m>` is stored as
`<m>.qweight`, `<m>.qzeros`, `<m>.scales` (and for GPTQ `<m>.g_idx`) instead of `<m>.weight`; the value
of weight[o, i] is scales[g, o] * (q[o, i] - z[g, o]) with g = g_idx[i] (AWQ: g = i // group_size).

- GPTQ (`quant_method: "gptq"`, bits 4 or 8): qweight int32 [in * bits / 32, out], packed along the
  input dimension, value k of a word in bits [bits*k, bits*(k+1)) (lowest first); qzeros int32
  [groups, out * bits / 32] packed the same way along the output dimension; scales float16 [groups, out];
  g_idx int32 [in] (any order with `desc_act`). `checkpoint_format` "gptq" (v1, the default) stores z - 1
  (the reader adds 1, as AutoGPTQ's kernels do), "gptq_v2" stores z.
- AWQ GEMM (`quant_method: "awq"`, `version: "gemm"`, 4 bits): qweight int32 [in, out / 8], packed along
  the output dimension with the interleaved order AWQ_ORDER (the value of output column 8c + AWQ_ORDER[k]
  in bits [4k, 4k+4) of word c); qzeros int32 [groups, out / 8] the same way; scales float16 [groups, out].

Each weight becomes a `ZeroPointTensor` (ember.quant.ggml.zero_point: Q4_0 / Q8_0 blocks plus exact
zero-point offsets). Where groups do not cover whole 32-value blocks the weight loads as float32 (exact)
and a warning says so. Layouts ember does not read raise an error naming what to do.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ember.quant.codes.grouped import grouped_weight, unpack_words
from ember.quant.ggml.zero_point import ZeroPointTensor
from ember.quant.hf.bitsandbytes import BitsAndBytesQuantization, read_bitsandbytes
from ember.quant.hf.scaled import SCALED_METHODS, ScaledQuantization, read_scaled
from ember.quant.int8.channel import Int8ChannelTensor

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # word position k holds output column 8c + AWQ_ORDER[k]
AWQ_UNORDER = tuple(AWQ_ORDER.index(column) for column in range(8))  # output column j sits at position AWQ_UNORDER[j]
GPTQ_FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> what is added to a stored zero point
GPTQ_BITS = (4, 8)
PARTS = ("qweight", "qzeros", "scales", "g_idx")
REQUIRED_PARTS = PARTS[:3]  # g_idx is optional: without it, groups run in column order
Quantized = ZeroPointTensor | Int8ChannelTensor
REQUANTIZE = "or load the float model and run `ember quantize --method {method} --bits 4`"


@dataclass(frozen=True)
class HFQuantization:
    """The part of `quantization_config` that says how the tensors are laid out."""

    method: str  # "gptq" or "awq"
    bits: int
    group_size: int  # -1: one group per row
    zero_offset: int  # added to every stored zero point (GPTQ v1: 1)

    @classmethod
    def from_config(cls, config: dict) -> HFQuantization:
        """Validate a `quantization_config` dict; every layout ember cannot run raises with the fix."""
        method = str(config.get("quant_method", "")).lower()
        if method == "gptq":
            return cls._gptq(config)
        if method == "awq":
            return cls._awq(config)
        raise ValueError(f"quantization_config quant_method {config.get('quant_method')!r} is not a layout ember reads; ember loads "
                         "AutoGPTQ / GPTQModel ('gptq'), AutoAWQ GEMM ('awq'), FP8 ('fp8'), compressed-tensors and bitsandbytes 4-bit checkpoints "
                         "and GGUF files: convert it to one of those, or load a float checkpoint")

    @classmethod
    def _gptq(cls, config: dict) -> HFQuantization:
        checkpoint_format = str(config.get("checkpoint_format") or "gptq").lower()
        if config.get("is_marlin_format") or checkpoint_format not in GPTQ_FORMATS:
            name = "marlin" if config.get("is_marlin_format") else checkpoint_format
            raise ValueError(f"GPTQ checkpoint_format {name!r} repacks the weights for one GPU kernel; ember reads 'gptq' and 'gptq_v2': "
                             f"save the model again in the 'gptq' format (GPTQModel: format='gptq'), {REQUANTIZE.format(method='gptq')}")
        bits = config.get("bits")
        if bits not in GPTQ_BITS:
            raise ValueError(f"GPTQ bits {bits} cannot run in ember's block kernels (4 or 8 bits): load the float model with "
                             f"transformers and save floats, {REQUANTIZE.format(method='gptq')}")
        if str(config.get("pack_dtype") or "int32").removeprefix("torch.") != "int32":
            raise ValueError(f"GPTQ pack_dtype {config.get('pack_dtype')!r}: ember reads int32 words; save the model again with "
                             f"GPTQModel's pack_dtype=torch.int32, {REQUANTIZE.format(method='gptq')}")
        if config.get("dynamic"):
            raise ValueError("GPTQ 'dynamic' (per-module bits and group sizes) is not read by ember; quantize with one setting for "
                             f"every module, {REQUANTIZE.format(method='gptq')}")
        return cls("gptq", bits, _group_size(config), GPTQ_FORMATS[checkpoint_format])

    @classmethod
    def _awq(cls, config: dict) -> HFQuantization:
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"AWQ version {version!r} packs the weights in another order; ember reads the GEMM layout: export with "
                             f"AutoAWQ version='GEMM', {REQUANTIZE.format(method='awq')}")
        if config.get("bits", config.get("w_bit")) != 4:
            raise ValueError(f"AWQ bits {config.get('bits', config.get('w_bit'))}: the GEMM layout ember reads is 4-bit; {REQUANTIZE.format(method='awq')}")
        if not config.get("zero_point", True):
            raise ValueError(f"AWQ without zero points is not read by ember; {REQUANTIZE.format(method='awq')}")
        return cls("awq", 4, _group_size(config), 0)


def _group_size(config: dict) -> int:
    size = config.get("group_size", config.get("q_group_size"))
    if not isinstance(size, int) or (size <= 0 and size != -1):
        raise ValueError(f"quantization_config group_size {size!r} must be a positive integer or -1 (one group per row)")
    return size


Layout = HFQuantization | ScaledQuantization | BitsAndBytesQuantization


def hf_quantization(folder: Path) -> Layout | None:
    """The folder's GPTQ / AWQ / scaled / bitsandbytes layout from config.json's `quantization_config`; None for a float
    checkpoint."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    quantization = config.get("quantization_config")
    if quantization is None:
        return None
    method = str(quantization.get("quant_method", "")).lower()
    if method in SCALED_METHODS:
        return ScaledQuantization.from_config(quantization)
    if method == "bitsandbytes":
        return BitsAndBytesQuantization.from_config(quantization)
    return HFQuantization.from_config(quantization)


def read_quantized(layout: Layout, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor | Quantized]]:
    """The checkpoint's tensors with each quantized linear's parts gathered into `<module>.weight`."""
    if isinstance(layout, ScaledQuantization):
        return read_scaled(layout, tensors)
    if isinstance(layout, BitsAndBytesQuantization):
        return read_bitsandbytes(tensors)
    return read_hf_quantized(layout, tensors)


def read_hf_quantized(layout: HFQuantization, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor | ZeroPointTensor]]:
    """The checkpoint's tensors with each quantized linear's parts gathered into `<module>.weight`."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        module, _, part = name.rpartition(".")
        if part not in PARTS:
            yield name, tensor
            continue
        parts = pending.setdefault(module, {})
        parts[part] = tensor
        if all(p in parts for p in REQUIRED_PARTS) and (layout.method == "awq" or "g_idx" in parts):
            yield f"{module}.weight", quantized_weight(layout, pending.pop(module), module)
    for module, parts in pending.items():  # GPTQ checkpoints without g_idx (groups in column order)
        missing = [p for p in REQUIRED_PARTS if p not in parts]
        if missing:
            raise ValueError(f"checkpoint has {module}.{next(iter(parts))} but not {module}.{missing[0]}: the {layout.method.upper()} files are incomplete")
        yield f"{module}.weight", quantized_weight(layout, parts, module)


def quantized_weight(layout: HFQuantization, parts: dict[str, torch.Tensor], module: str) -> torch.Tensor | ZeroPointTensor:
    """One linear's weight: a ZeroPointTensor, or float32 where its groups do not cover whole blocks."""
    codes, zeros, scales = unpack(layout, parts, module)
    rows, cols = codes.shape
    group_size = layout.group_size if layout.group_size > 0 else cols
    g_idx = parts.get("g_idx")
    groups = torch.arange(cols, dtype=torch.int64) // group_size if g_idx is None else g_idx.to(torch.int64)
    if tuple(groups.shape) != (cols,) or int(groups.min()) < 0 or int(groups.max()) >= scales.shape[0]:
        raise ValueError(f"{module}.g_idx must hold {cols} group numbers in [0, {scales.shape[0]}): the checkpoint is damaged")
    return grouped_weight(layout.bits, codes, zeros, scales, groups, module)


def unpack(layout: HFQuantization, parts: dict[str, torch.Tensor], module: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes int32 [out, in], zero points int32 [groups, out], scales float16 [groups, out]) from the packed parts."""
    qweight, qzeros, scales = parts["qweight"], parts["qzeros"], parts["scales"]
    for part, tensor in (("qweight", qweight), ("qzeros", qzeros)):
        if tensor.dtype != torch.int32 or tensor.dim() != 2:
            raise ValueError(f"{module}.{part} must be int32 [.., ..], got {tensor.dtype} {tuple(tensor.shape)}: not a {layout.method.upper()} checkpoint ember reads")
    if layout.method == "gptq":
        codes = unpack_words(qweight.t(), layout.bits)  # [out, in]
        zeros = unpack_words(qzeros, layout.bits) + layout.zero_offset
    else:
        codes = unpack_words(qweight, layout.bits, AWQ_UNORDER).t()
        zeros = unpack_words(qzeros, layout.bits, AWQ_UNORDER)
    if scales.dim() != 2 or tuple(zeros.shape) != tuple(scales.shape) or scales.shape[1] != codes.shape[0]:
        raise ValueError(f"{module}: scales {tuple(scales.shape)} and qzeros (unpacked {tuple(zeros.shape)}) must both be [groups, "
                         f"{codes.shape[0]}]: the checkpoint does not match its quantization_config (bits {layout.bits})")
    return codes.contiguous(), zeros, scales.to(torch.float16)
