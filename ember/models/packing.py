"""Packed parameters: one fused weight (e.g. qkv_proj) filled from several checkpoint tensors.

A module declares `packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}`; the loader
concatenates the checkpoint's parts along the output dimension, in that order. Fewer, larger
matrix products are what makes a CPU step fast. Parts in one GGML block format stay in blocks
(rows of blocks concatenate), so do W8A8 int8 rows and GPTQ / AWQ groups; GGML parts in mixed formats become Q8_0 where
that is exact (Q4_0 / Q5_0 / Q8_0), else `GGMLRowParts` (each part in its blocks); other mixes are fused as float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ember.quant.ggml.blocks import SYMMETRIC_32, GGMLRowParts, GGMLTensor, as_q8_0
from ember.quant.ggml.kernels import MAX_ROW_PARTS
from ember.quant.ggml.zero_point import ZeroPointTensor
from ember.quant.int8.channel import Int8ChannelTensor

QuantizedPart = GGMLTensor | GGMLRowParts | Int8ChannelTensor | ZeroPointTensor


@runtime_checkable
class FusedProjections(Protocol):
    """A module with fused projections: {fused name: the checkpoint's parts, in the fused order}."""

    packed_modules: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class PackedTarget:
    """Where one checkpoint tensor goes: the fused parameter's name, its slot, how many slots."""

    name: str
    index: int
    num_parts: int


@dataclass
class PackingPlan:
    """Checkpoint name -> packed target for every fused parameter of a model, and the parts gathered so far."""

    targets: dict[str, PackedTarget]
    _parts: dict[str, dict[int, torch.Tensor | QuantizedPart]] = field(default_factory=dict)

    @classmethod
    def for_model(cls, model: nn.Module, parameter_names: set[str]) -> PackingPlan:
        targets = {}
        for module_name, module in model.named_modules():
            if not isinstance(module, FusedProjections):
                continue
            packed = module.packed_modules
            prefix = f"{module_name}." if module_name else ""
            for fused, parts in packed.items():
                for suffix in ("weight", "bias"):
                    fused_name = f"{prefix}{fused}.{suffix}"
                    if fused_name not in parameter_names:
                        continue
                    for index, part in enumerate(parts):
                        targets[f"{prefix}{part}.{suffix}"] = PackedTarget(fused_name, index, len(parts))
        return cls(targets)

    def add(self, checkpoint_name: str, tensor: torch.Tensor | QuantizedPart) -> tuple[str, torch.Tensor | QuantizedPart] | None:
        """Keep a part; returns (fused name, fused tensor) once every part of it has arrived."""
        target = self.targets[checkpoint_name]
        parts = self._parts.setdefault(target.name, {})
        parts[target.index] = tensor
        if len(parts) < target.num_parts:
            return None
        del self._parts[target.name]
        return target.name, _concat_rows([parts[i] for i in range(target.num_parts)])


def _concat_rows(parts: list[torch.Tensor | QuantizedPart]) -> torch.Tensor | QuantizedPart:
    """Parts stacked along the output dimension: rows of blocks when every part shares one GGML format
    (or Q8_0 when they mix Q4_0 / Q5_0 / Q8_0, else row parts in their own formats), W8A8 int8 rows when every
    part is, or GPTQ / AWQ groups sharing their column order; else float."""
    if all(isinstance(p, Int8ChannelTensor) for p in parts):
        return Int8ChannelTensor.concat(parts)
    if all(isinstance(p, ZeroPointTensor) for p in parts) and ZeroPointTensor.fusable(parts):
        return ZeroPointTensor.concat(parts)
    if all(isinstance(p, GGMLTensor) for p in parts):
        first = parts[0]
        if all(p.format == first.format and p.cols == first.cols for p in parts):
            return GGMLTensor.concat(parts)
        if all(p.format.name in SYMMETRIC_32 and p.cols == first.cols for p in parts):
            return GGMLTensor.concat([as_q8_0(p) for p in parts])  # e.g. Q5_0 q/k with a Q8_0 v: exact as Q8_0
        if all(p.cols == first.cols for p in parts) and len(parts) <= MAX_ROW_PARTS:
            return GGMLRowParts(parts)  # e.g. Q4_K q/k with a Q6_K v: each part in its own blocks
    return torch.cat([p if isinstance(p, torch.Tensor) else p.dequantize() for p in parts], dim=0)
