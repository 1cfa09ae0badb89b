"""Tiny 8-bit checkpoints with float scales (transformers' FineGrainedFP8, compressed-tensors FP8 and W8A8 int8),
written from the formats' rules: codes and scales chosen here from a float checkpoint (absmax / code range per tensor,
channel or block, as llm-compressor and transformers' FP8 quantizer do), and the float weights they stand for
computed from those codes and scales."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
E4M3_MAX = 448.0


def _scale_shape(weight: torch.Tensor, strategy: str, block: tuple[int, int]) -> torch.Tensor:
    """|w| max per tensor ([1]), channel ([out, 1]) or block ([out / bo, in / bi]), float32."""
    magnitude = weight.abs().float()
    if strategy == "tensor":
        return magnitude.max().reshape(1)
    if strategy == "channel":
        return magnitude.amax(dim=1, keepdim=True)
    bo, bi = block
    rows, cols = weight.shape
    padded = torch.zeros(-(-rows // bo) * bo, -(-cols // bi) * bi)
    padded[:rows, :cols] = magnitude
    return padded.reshape(padded.shape[0] // bo, bo, padded.shape[1] // bi, bi).amax(dim=(1, 3))


def _per_value(scale: torch.Tensor, rows: int, cols: int, strategy: str, block: tuple[int, int]) -> torch.Tensor:
    if strategy == "block":
        return scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return scale.reshape(-1, 1).expand(rows, cols) if strategy == "channel" else scale.expand(rows, cols)


def quantize(weight: torch.Tensor, codes: str, strategy: str, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, scale, the float value they stand for) of one weight."""
    top = E4M3_MAX if codes == "float" else 127.0
    scale = (_scale_shape(weight, strategy, block) / top).clamp(min=1e-12)
    per_value = _per_value(scale, *weight.shape, strategy, block)
    scaled = weight.float() / per_value
    stored = scaled.to(torch.float8_e4m3fn) if codes == "float" else torch.round(scaled).clamp(-127, 127).to(torch.int8)
    return stored, scale, stored.float() * per_value


def write_checkpoint(source: Path, target: Path, quantization_config: dict, codes: str, strategy: str,
                     block: tuple[int, int] = (32, 32), scale_name: str = "weight_scale") -> dict[str, torch.Tensor]:
    """`source` (a float HF folder) with its decoder linears in 8-bit codes; returns the float32 state it stands for."""
    state = load_file(str(source / "model.safetensors"))
    tensors, reference = {}, {}
    for name, tensor in state.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and ".layers." in name and module.rpartition(".")[2] in LINEARS:
            stored, scale, value = quantize(tensor, codes, strategy, block)
            tensors[name], tensors[f"{module}.{scale_name}"] = stored, scale
            tensors[f"{module}.input_scale"] = torch.ones(1)  # a static activation scale, which ember drops
            reference[name] = value
        else:
            tensors[name] = tensor
            reference[name] = tensor.float()
    target.mkdir(parents=True)
    save_file(tensors, str(target / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (target / "config.json").write_text(json.dumps(config))
    return reference


def compressed_tensors_config(codes: str, strategy: str, int8_activations: bool, block: tuple[int, int] = (32, 32)) -> dict:
    """llm-compressor's description of one scheme for every Linear but the LM head."""
    weights = {"num_bits": 8, "type": codes, "strategy": strategy, "symmetric": True, "dynamic": False,
               "block_structure": list(block) if strategy == "block" else None}
    activations = {"num_bits": 8, "type": "int" if int8_activations else "float", "strategy": "token", "dynamic": True,
                   "symmetric": True}
    return {"quant_method": "compressed-tensors", "format": f"{codes}-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": activations}},
            "ignore": ["lm_head"]}


def write_packed_checkpoint(source: Path, target: Path, bits: int, group_size: int | None,
                            scale_dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """`source` with its decoder linears as llm-compressor's pack-quantized symmetric ints (per group, or per channel
    when `group_size` is None); returns the float32 state it stands for."""
    state = load_file(str(source / "model.safetensors"))
    tensors, reference = {}, {}
    top = (1 << (bits - 1)) - 1
    for name, tensor in state.items():
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and ".layers." in name and module.rpartition(".")[2] in LINEARS):
            tensors[name], reference[name] = tensor, tensor.float()
            continue
        rows, cols = tensor.shape
        size = group_size or cols
        grouped = tensor.float().reshape(rows, cols // size, size)
        scale = (grouped.abs().amax(dim=2) / top).clamp(min=1e-6).to(scale_dtype)  # [rows, groups]
        codes = torch.round(grouped / scale.float().unsqueeze(2)).clamp(-top - 1, top).to(torch.int64)
        reference[name] = (codes.float() * scale.float().unsqueeze(2)).reshape(rows, cols)
        unsigned = (codes.reshape(rows, cols) + (1 << (bits - 1))).reshape(rows, cols * bits // 32, 32 // bits)
        words = torch.zeros(rows, cols * bits // 32, dtype=torch.int64)
        for k in range(32 // bits):  # the first value in the lowest bits
            words |= unsigned[:, :, k] << (bits * k)
        tensors[f"{module}.weight_packed"] = words.to(torch.uint32).view(torch.int32)
        tensors[f"{module}.weight_scale"] = scale
        tensors[f"{module}.weight_shape"] = torch.tensor([rows, cols])
    target.mkdir(parents=True)
    save_file(tensors, str(target / "model.safetensors"))
    config = json.loads((source / "config.json").read_text())
    strategy = "group" if group_size else "channel"
    weights = {"num_bits": bits, "type": "int", "strategy": strategy, "symmetric": True, "group_size": group_size}
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                     "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ["lm_head"]}
    (target / "config.json").write_text(json.dumps(config))
    return reference
