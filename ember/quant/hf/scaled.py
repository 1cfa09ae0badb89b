"""HF checkpoints whose linears hold 8- or 4-bit codes with float scales, as vLLM users find them on the Hub.

- transformers' FineGrainedFP8 (`quant_method: "fp8"`, `weight_block_size` [bo, bi]; Qwen3-FP8, DeepSeek-V3):
  `<m>.weight` float8_e4m3fn [out, in] and `<m>.weight_scale_inv` float32 [ceil(out / bo), ceil(in / bi)];
  w[o, i] = code[o, i] * scale_inv[o // bo, i // bi].
- compressed-tensors (`quant_method: "compressed-tensors"`, llm-compressor's output), 8-bit symmetric weights:
  `format` "float-quantized" (FP8: e4m3 codes) or "int-quantized" (int8 codes), `strategy` "tensor" (scale [1]),
  "channel" ([out, 1]) or "block" ([out / bo, in / bi]); `<m>.weight` and `<m>.weight_scale`; w = code * scale.
- compressed-tensors `format` "pack-quantized" (W4A16 / W8A16, RedHat's `quantized.w4a16`): symmetric int4 or int8
  codes offset by 2^(bits-1) and packed along the input dimension into int32 words (`<m>.weight_packed`
  [out, in * bits / 32], the first value in the lowest bits), `<m>.weight_scale` [out, groups] per group of
  `group_size` inputs (strategy "group") or per channel, `<m>.weight_shape`; w = scale * (code - 2^(bits-1)).

ember's FP8 blocks take one power-of-two scale per 32 values, which cannot hold a float scale per channel or per
tile, so an FP8 weight is dequantized at load (exact in float32: 4 bytes a parameter; `ember quantize --method fp8`
gives ember's own 8-bit blocks). Packed int4 / int8 weights are Q4_0 / Q8_0 blocks as they stand (a group's scale on
each of its 32-value blocks; float32 where a scale has no float16 value or groups split a block). An int8 weight with one scale per channel whose activations the checkpoint also
rounds to int8 (W8A8, RedHat's `quantized.w8a8` models) is exactly ember's W8A8 layer (int8 rows, one float32
scale each, activations rounded per token), and loads as one; other int8 weights dequantize too. Static activation
scales (`input_scale`) and KV-cache scales (`k_scale`, `v_scale`) are dropped: ember rounds activations per token
(W8A8) or keeps them float, and its KV cache takes its own dtype (`--kv-cache-dtype`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ember.quant.codes.grouped import dequantize_reference, grouped_weight, unpack_words
from ember.quant.ggml.zero_point import ZeroPointTensor
from ember.quant.int8.channel import MAX_CODE, Int8ChannelTensor

Weight = torch.Tensor | Int8ChannelTensor | ZeroPointTensor

DROPPED_SUFFIXES = (".input_scale", ".output_scale", ".k_scale", ".v_scale", ".q_scale", ".weight_shape")
SCALE_PARTS = ("weight_scale_inv", "weight_scale")
STRATEGIES = ("tensor", "channel", "block")
SCALED_METHODS = ("fp8", "compressed-tensors")


@dataclass(frozen=True)
class ScaledQuantization:
    """How a checkpoint's coded weights are scaled: FP8 or int8 codes per tensor, channel or [bo, bi] block, or packed
    int4 / int8 codes per group or channel."""

    method: str  # "fp8" or "compressed-tensors"
    codes: str  # "float" (e4m3) or "int"
    strategy: str  # one of STRATEGIES, or "group" (packed codes)
    block: tuple[int, int] | None  # [bo, bi] for "block"
    int8_activations: bool  # the checkpoint rounds activations to int8 too (W8A8)
    packed_bits: int | None = None  # 4 or 8: codes packed into int32 words ("pack-quantized")
    group_size: int | None = None  # inputs per scale of packed codes (None: one scale per channel)

    @classmethod
    def from_config(cls, config: dict) -> ScaledQuantization:
        """Validate a `quantization_config` of either method; a layout ember cannot read raises with the fix."""
        if str(config.get("quant_method")).lower() == "fp8":
            block = config.get("weight_block_size")
            if block is None:
                return cls("fp8", "float", "tensor", None, False)
            return cls("fp8", "float", "block", _block(block), False)
        return cls._compressed_tensors(config)

    @classmethod
    def _compressed_tensors(cls, config: dict) -> ScaledQuantization:
        groups = list((config.get("config_groups") or {}).values())
        schemes = {_scheme_key(group) for group in groups}
        if len(schemes) != 1:
            raise ValueError("compressed-tensors config_groups with several weight schemes are not read by ember; "
                             "save the model with one scheme for every linear, or load its float checkpoint")
        weights = groups[0].get("weights") or {}
        kind, bits, strategy = weights.get("type"), weights.get("num_bits"), weights.get("strategy")
        if config.get("format") == "pack-quantized":
            return cls._packed(weights)
        if bits != 8 or kind not in ("float", "int") or strategy not in STRATEGIES or weights.get("symmetric") is False:
            raise ValueError(f"compressed-tensors weights {bits}-bit {kind} {strategy} (symmetric {weights.get('symmetric')}) "
                             "are not read by ember: it loads 8-bit symmetric float (FP8) or int weights scaled per tensor, "
                             "channel or block; load the float checkpoint, or quantize it with `ember quantize`")
        activations = groups[0].get("input_activations") or {}
        int8_activations = activations.get("type") == "int" and activations.get("num_bits") == 8
        block = _block(weights.get("block_structure")) if strategy == "block" else None
        return cls("compressed-tensors", kind, strategy, block, int8_activations)

    @classmethod
    def _packed(cls, weights: dict) -> ScaledQuantization:
        bits, strategy, group_size = weights.get("num_bits"), weights.get("strategy"), weights.get("group_size")
        if bits not in (4, 8) or weights.get("type") != "int" or strategy not in ("group", "channel") or weights.get("symmetric") is False:
            raise ValueError(f"compressed-tensors pack-quantized weights {bits}-bit {weights.get('type')} {strategy} (symmetric "
                             f"{weights.get('symmetric')}) are not read by ember: it loads symmetric int4 or int8 codes scaled per "
                             "group or channel; load the float checkpoint, or quantize it with `ember quantize`")
        if strategy == "group" and (not isinstance(group_size, int) or group_size <= 0):
            raise ValueError(f"compressed-tensors group strategy needs a positive group_size, got {group_size!r}")
        return cls("compressed-tensors", "int", strategy, None, False, bits, group_size if strategy == "group" else None)

    @property
    def name(self) -> str:
        return "FP8" if self.codes == "float" else "INT8"


def _scheme_key(group: dict) -> tuple:
    weights = group.get("weights") or {}
    return tuple(str(weights.get(key)) for key in ("num_bits", "type", "strategy", "symmetric", "block_structure"))


def _block(block) -> tuple[int, int]:
    if not isinstance(block, (list, tuple)) or len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block):
        raise ValueError(f"weight block size {block!r} must be two positive integers [rows, columns]")
    return int(block[0]), int(block[1])


def read_scaled(layout: ScaledQuantization, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, Weight]]:
    """The checkpoint's tensors with each coded weight and its scale gathered into `<module>.weight`."""
    codes: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    for name, tensor in tensors:
        if name.endswith(DROPPED_SUFFIXES):
            continue
        module, _, part = name.rpartition(".")
        if part in SCALE_PARTS:
            scales[module] = tensor
        elif part == "weight_packed" or (part == "weight" and tensor.dtype in (torch.float8_e4m3fn, torch.int8)):
            codes[module] = tensor
        else:
            yield name, tensor
            continue
        if module in codes and module in scales:
            yield f"{module}.weight", scaled_weight(layout, codes.pop(module), scales.pop(module), module)
    unpaired = sorted(set(codes) ^ set(scales))
    if unpaired:
        raise ValueError(f"{unpaired[0]} has codes without a scale or a scale without codes: the checkpoint is incomplete")


def scaled_weight(layout: ScaledQuantization, codes: torch.Tensor, scale: torch.Tensor, module: str) -> Weight:
    """One linear's weight: blocks of packed codes, ember's W8A8 rows where the checkpoint is W8A8 per channel, else
    the exact float32 value."""
    if layout.packed_bits is not None:
        return packed_weight(layout, codes, scale, module)
    rows, cols = codes.shape
    per_value = _expanded_scale(layout, scale.float(), rows, cols, module)
    if layout.codes == "int" and layout.int8_activations and layout.strategy != "block" and int(codes.min()) >= -MAX_CODE:
        return Int8ChannelTensor(codes.contiguous(), per_value[:, 0].contiguous())
    return codes.float() * per_value


def _expanded_scale(layout: ScaledQuantization, scale: torch.Tensor, rows: int, cols: int, module: str) -> torch.Tensor:
    """The scale of every value, [rows, cols] (a broadcast view where the scale is per tensor or per channel)."""
    if layout.strategy == "block":
        assert layout.block is not None  # from_config sets it for "block"
        bo, bi = layout.block
        expected = (-(-rows // bo), -(-cols // bi))
        if tuple(scale.shape) != expected:
            raise ValueError(f"{module}: block scales {tuple(scale.shape)}, expected {expected} for [{rows}, {cols}] in {bo}x{bi} blocks")
        return scale.repeat_interleave(bo, 0)[:rows].repeat_interleave(bi, 1)[:, :cols]
    if scale.numel() == 1:
        return scale.reshape(1, 1).expand(rows, cols)
    if scale.numel() != rows:
        raise ValueError(f"{module}: {scale.numel()} scales for {rows} output channels ({layout.strategy} strategy)")
    return scale.reshape(rows, 1).expand(rows, cols)


def packed_weight(layout: ScaledQuantization, packed: torch.Tensor, scale: torch.Tensor, module: str) -> Weight:
    """Packed symmetric codes as Q4_0 / Q8_0 blocks (`grouped_weight`), or float32 where a scale has no float16 value."""
    bits = layout.packed_bits
    assert bits is not None  # packed_weight is called for packed layouts only
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"{module}.weight_packed must be int32 [out, in * {bits} / 32], got {packed.dtype} {tuple(packed.shape)}")
    codes = unpack_words(packed, bits)  # [out, in], unsigned: the signed code plus 2^(bits - 1)
    rows, cols = codes.shape
    group_size = layout.group_size or cols
    groups = torch.arange(cols, dtype=torch.int64) // group_size
    if tuple(scale.shape) != (rows, -(-cols // group_size)):
        raise ValueError(f"{module}.weight_scale {tuple(scale.shape)}: expected [{rows}, {-(-cols // group_size)}] for "
                         f"{cols} inputs in groups of {group_size}")
    scales = scale.t().contiguous()  # [groups, out], as GPTQ's
    zeros = torch.full(scales.shape, 1 << (bits - 1), dtype=torch.int32)
    half = scales.to(torch.float16)
    if not bool((half.to(scales.dtype) == scales).all()) or not bool(half.isfinite().all()):
        return dequantize_reference(codes, zeros, scales.float(), groups)  # exact from the scales as stored
    return grouped_weight(bits, codes, zeros, half, groups, module)
