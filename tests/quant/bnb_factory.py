"""Tiny bitsandbytes 4-bit checkpoints written from the format's rules (as transformers saves `Linear4bit` states;
the rules were checked against bitsandbytes 0.50's own quantize_4bit / dequantize_4bit): codes chosen here (each
value's nearest level over its block's absmax), packed two a byte with the first in the high nibble, the state's
JSON as bytes, and with double quantization the absmax values as 8-bit codes over a map of our choosing."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ember.quant.ggml.blocks import NF4_LEVELS

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCKSIZE, NESTED_BLOCKSIZE = 64, 256


def _nested(absmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, torch.Tensor]:
    """absmax as uint8 codes over a 256-level map, per NESTED_BLOCKSIZE a scale, around their mean; and its values."""
    offset = float(absmax.mean())
    centred = absmax - offset
    blocks = -(-centred.numel() // NESTED_BLOCKSIZE)
    padded = torch.nn.functional.pad(centred, (0, blocks * NESTED_BLOCKSIZE - centred.numel()))
    scales = padded.reshape(blocks, NESTED_BLOCKSIZE).abs().amax(dim=1).clamp(min=1e-12)
    levels = torch.linspace(-1.0, 1.0, 256)
    per_value = scales.repeat_interleave(NESTED_BLOCKSIZE)[: centred.numel()]
    codes = (centred / per_value).unsqueeze(1).sub(levels).abs().argmin(dim=1)
    values = levels[codes] * per_value + offset
    return codes.to(torch.uint8), scales, levels, offset, values


def quantize(weight: torch.Tensor, nested: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The saved state of one weight (keys after `<m>.weight`) and the values it stands for."""
    flat = weight.float().flatten()
    absmax = flat.reshape(-1, BLOCKSIZE).abs().amax(dim=1)
    levels = torch.tensor(NF4_LEVELS)
    codes = (flat / absmax.repeat_interleave(BLOCKSIZE)).unsqueeze(1).sub(levels).abs().argmin(dim=1)
    meta = {"quant_type": "nf4", "blocksize": BLOCKSIZE, "dtype": "bfloat16", "shape": list(weight.shape)}
    state = {"": (codes[0::2] << 4 | codes[1::2]).to(torch.uint8).unsqueeze(1), "absmax": absmax, "quant_map": levels}
    if nested:
        state["absmax"], state["nested_absmax"], state["nested_quant_map"], offset, absmax = _nested(absmax)
        meta.update(nested_blocksize=NESTED_BLOCKSIZE, nested_dtype="float32", nested_offset=offset)
    state["quant_state.bitsandbytes__nf4"] = torch.tensor(list(json.dumps(meta).encode()), dtype=torch.uint8)
    values = (levels[codes] * absmax.repeat_interleave(BLOCKSIZE)).to(torch.bfloat16).float().reshape(weight.shape)
    return state, values


def write_checkpoint(source: Path, target: Path, nested: bool) -> dict[str, torch.Tensor]:
    """`source` (a float HF folder) with its decoder linears as bitsandbytes NF4; returns the float32 state it stands for."""
    tensors, reference = {}, {}
    for name, tensor in load_file(str(source / "model.safetensors")).items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and ".layers." in name and module.rpartition(".")[2] in LINEARS:
            state, reference[name] = quantize(tensor, nested)
            tensors.update({f"{name}.{key}".rstrip("."): value for key, value in state.items()})
        else:
            tensors[name], reference[name] = tensor, tensor.float()
    target.mkdir(parents=True)
    save_file(tensors, str(target / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                     "bnb_4bit_use_double_quant": nested, "bnb_4bit_compute_dtype": "bfloat16"}
    (target / "config.json").write_text(json.dumps(config))
    return reference
