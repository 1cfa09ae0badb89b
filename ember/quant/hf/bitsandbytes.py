"""HF checkpoints saved by bitsandbytes in 4 bits (`quant_method: "bitsandbytes"`, `load_in_4bit`; the `-bnb-4bit`
models QLoRA fine-tunes publish), read as the weights bitsandbytes computes from them.

Each quantized linear `<m>` holds, beside `<m>.weight` (uint8 [values / 2, 1]: two 4-bit codes a byte, the first in
the high nibble, over the row-major [out, in] weight), its quantization state under `<m>.weight.`:
`absmax` (one scale per `blocksize` values), `quant_map` (the 16 code values: NF4's or FP4's), with double
quantization `nested_absmax` and `nested_quant_map` (the absmax values are themselves 8-bit codes:
absmax = nested_quant_map[code] * nested_absmax[i // nested_blocksize] + nested_offset), and
`quant_state.bitsandbytes__nf4` (or `__fp4`): the JSON of blocksize, shape, dtype and the nested fields, as bytes.
A value is quant_map[code] * absmax[its block], computed in float32 and rounded to the state's dtype, as
bitsandbytes' own dequantization does (checked against bitsandbytes 0.50: equal for plain and nested states).

The float scales fit none of ember's block formats exactly, so weights load dequantized (float32 holding those
values); `--quantization nf4` (vLLM's `bitsandbytes`) rounds them into ember's NF4 blocks as they load: the same
codes, each block's scale rounded to float16. 8-bit (LLM.int8) checkpoints are refused with the fix named.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

STATE_PARTS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")
STATE_KEY_PREFIX = "quant_state.bitsandbytes__"
STATE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class BitsAndBytesQuantization:
    """A bitsandbytes 4-bit checkpoint (its per-tensor states say the rest)."""

    method: str = "bitsandbytes"

    @classmethod
    def from_config(cls, config: dict) -> BitsAndBytesQuantization:
        """Validate a bitsandbytes `quantization_config`; 8-bit raises naming the fix."""
        if config.get("load_in_8bit") or config.get("_load_in_8bit"):
            raise ValueError("bitsandbytes 8-bit (LLM.int8) checkpoints are not read by ember: load the float model with "
                             "--quantization int8, or a GGUF / GPTQ / AWQ checkpoint")
        if not (config.get("load_in_4bit") or config.get("_load_in_4bit")):
            raise ValueError("a bitsandbytes quantization_config without load_in_4bit describes no format ember reads")
        return cls()


def read_bitsandbytes(tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each 4-bit weight and its state gathered into `<m>.weight`, dequantized."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        weight, part = _state_part(name)
        if weight is None and (name in pending or tensor.dtype == torch.uint8):
            weight, part = name, "codes"  # the packed codes themselves (a float weight is a layer left unquantized)
        if weight is None:
            yield name, tensor
            continue
        parts = pending.setdefault(weight, {})
        parts[part] = tensor
        if _complete(parts):
            yield weight, dequantize(pending.pop(weight), weight)
    if pending:
        weight, parts = next(iter(pending.items()))
        raise ValueError(f"{weight} lacks part of its bitsandbytes state (has {sorted(parts)}): the checkpoint is incomplete")


def _state_part(name: str) -> tuple[str | None, str]:
    """(`<m>.weight`, the state part) for a state tensor's name; (None, "") for any other tensor."""
    for part in STATE_PARTS:
        if name.endswith(f".weight.{part}"):
            return name.removesuffix(f".{part}"), part
    head, marker, _ = name.rpartition(f".{STATE_KEY_PREFIX}")
    if marker:
        return head, "quant_state"
    return None, ""


def _complete(parts: dict[str, torch.Tensor]) -> bool:
    if not all(key in parts for key in ("codes", "absmax", "quant_map", "quant_state")):
        return False
    return "nested_blocksize" not in _meta(parts) or all(key in parts for key in ("nested_absmax", "nested_quant_map"))


def _meta(parts: dict[str, torch.Tensor]) -> dict:
    return json.loads(bytes(parts["quant_state"].to(torch.uint8).tolist()).decode("utf-8"))


def dequantize(parts: dict[str, torch.Tensor], weight: str) -> torch.Tensor:
    """One weight's values as bitsandbytes computes them: float32 products rounded to the state's dtype."""
    meta = _meta(parts)
    shape, blocksize = tuple(meta["shape"]), int(meta["blocksize"])
    packed = parts["codes"].flatten().to(torch.int64)
    codes = torch.stack([packed >> 4, packed & 15], dim=1).flatten()
    numel = shape[0] * shape[1]
    if codes.numel() < numel:
        raise ValueError(f"{weight} holds {codes.numel()} codes for a {shape[0]}x{shape[1]} weight: the checkpoint is damaged")
    absmax = parts["absmax"]
    if "nested_blocksize" in meta:
        nested = parts["nested_absmax"].float().repeat_interleave(int(meta["nested_blocksize"]))[: absmax.numel()]
        absmax = parts["nested_quant_map"].float()[absmax.to(torch.int64)] * nested + float(meta["nested_offset"])
    scales = absmax.float().repeat_interleave(blocksize)[:numel]
    values = parts["quant_map"].float()[codes[:numel]] * scales
    return values.to(STATE_DTYPES.get(meta.get("dtype"), torch.float32)).float().reshape(shape)
