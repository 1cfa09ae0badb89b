"""Quantized checkpoints on disk: written by `ember quantize`, read back by ember's loader.

A GGUF source gives a GGUF file (`model.gguf`: the source's metadata and tokenizer, the
quantized matrices as Q4_0/Q4_1/Q8_0 tensors in llama.cpp's row order), which ember and
llama.cpp both read; NF4/FP8 matrices go in as raw I8 rows of blocks named under
EMBER_BLOCK_FORMATS_KEY (ember reads those, llama.cpp does not). An HF folder gives `model.safetensors` (block tensors as uint8, the rest
float32) beside the source's config and tokenizer files. Both get `ember_quantization.json`
(method, grid, calibration, which tensors are blocks). The folder is written under a temporary
name and renamed to --out only when complete, so a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ember.models.config import ModelConfig
from ember.quant.config import QuantizeConfig
from ember.quant.ggml_blocks import FORMATS, GGUF_FORMATS, GGMLTensor

QUANTIZATION_FILE = "ember_quantization.json"
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7}  # gguf.LlamaFileType
# GGUF key listing tensors in ember's own block formats (NF4, FP8), stored as raw I8 rows of blocks:
# a JSON object {gguf tensor name: format name}. llama.cpp cannot run such a file; ember's loader can.
EMBER_BLOCK_FORMATS_KEY = "ember.block_formats"


def write_quantized(
    source: Path, model: nn.Module, model_config: ModelConfig, blocks: dict[str, GGMLTensor], config: QuantizeConfig, calib_tokens: int
) -> tuple[int, int, int]:
    """Write the checkpoint to config.out atomically; returns (quantized bytes, float bytes, parameters)."""
    tensors = checkpoint_tensors(model, model_config, blocks)
    partial = config.out.parent / f".{config.out.name}.partial-{os.getpid()}"
    partial.mkdir(parents=True)
    try:
        if source.is_file():
            written = _write_gguf(source, partial / "model.gguf", tensors, model_config, config.format_name)
        else:
            written = _write_safetensors(source, partial, tensors)
        _write_description(partial / QUANTIZATION_FILE, config, calib_tokens, written)
        os.rename(partial, config.out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return _sizes(written.values())


def checkpoint_tensors(model: nn.Module, config: ModelConfig, blocks: dict[str, GGMLTensor]) -> dict[str, torch.Tensor | GGMLTensor]:
    """Checkpoint-named tensors: blocks where quantized, float elsewhere, fused projections split back into parts."""
    named: dict[str, torch.Tensor | GGMLTensor] = {}
    for name, tensor in [*model.state_dict().items(), *blocks.items()]:
        if isinstance(tensor, torch.Tensor) and name in blocks:
            continue
        named.update(_split_fused(name, tensor, config))
    return named


def _split_fused(name: str, tensor: torch.Tensor | GGMLTensor, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor | GGMLTensor]]:
    prefix, fused, kind = _name_parts(name)
    if fused not in FUSED_PARTS:
        yield name, tensor
        return
    kv = config.num_kv_heads * config.head_dim
    sizes = [config.num_heads * config.head_dim, kv, kv] if fused == "qkv_proj" else [config.intermediate_size] * 2
    start = 0
    for part, size in zip(FUSED_PARTS[fused], sizes, strict=True):
        if isinstance(tensor, GGMLTensor):
            piece: torch.Tensor | GGMLTensor = GGMLTensor(tensor.data[start : start + size], tensor.format, tensor.cols)
        else:
            piece = tensor[start : start + size]
        yield f"{prefix}{part}.{kind}", piece
        start += size


def _name_parts(name: str) -> tuple[str, str, str]:
    head, _, kind = name.rpartition(".")
    prefix, _, module = head.rpartition(".")
    return (f"{prefix}." if prefix else ""), module, kind


def _write_gguf(source: Path, target: Path, tensors: dict, config: ModelConfig, format_name: str) -> dict[str, torch.Tensor | GGMLTensor]:
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

    from ember.models.gguf_loader import hf_name

    reader = GGUFReader(str(source))
    writer = GGUFWriter(str(target), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    if format_name in FILE_TYPES:
        writer.add_file_type(FILE_TYPES[format_name])
    ember_formats = {}
    written = {}
    for source_tensor in reader.tensors:
        name = hf_name(source_tensor.name)
        value = _llama_cpp_rows(source_tensor.name, tensors[name], config)
        written[name] = tensors[name]
        if isinstance(value, GGMLTensor) and value.format.name in GGUF_FORMATS:
            raw = value.data.numpy()
            writer.add_tensor(source_tensor.name, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType[value.format.name])
        elif isinstance(value, GGMLTensor):
            ember_formats[source_tensor.name] = value.format.name
            writer.add_tensor(source_tensor.name, value.data.numpy().view(np.int8), raw_dtype=GGMLQuantizationType.I8)
        else:
            writer.add_tensor(source_tensor.name, np.ascontiguousarray(value.float().numpy()))
    if ember_formats:
        writer.add_string(EMBER_BLOCK_FORMATS_KEY, json.dumps(ember_formats))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def _llama_cpp_rows(gguf_name: str, value: torch.Tensor | GGMLTensor, config: ModelConfig) -> torch.Tensor | GGMLTensor:
    """q/k rows back in llama.cpp's interleaved rotary order (what the GGUF loader undoes)."""
    if config.architecture != "llama" or not gguf_name.endswith(("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias")):
        return value
    heads = config.num_heads if "attn_q" in gguf_name else config.num_kv_heads
    rows = value.shape[0]
    order = torch.arange(rows).reshape(heads, 2, rows // heads // 2).transpose(1, 2).reshape(rows)
    return value.rows(order) if isinstance(value, GGMLTensor) else value[order]


def _write_safetensors(source: Path, target: Path, tensors: dict) -> dict[str, torch.Tensor | GGMLTensor]:
    from safetensors import safe_open
    from safetensors.torch import save_file

    from ember.models.hf_loader import safetensors_files

    names = []
    for file in safetensors_files(source):
        with safe_open(str(file), framework="pt") as shard:
            names.extend(shard.keys())
    written = {name: tensors[name] for name in names}
    save_file({n: t.data if isinstance(t, GGMLTensor) else t.float().contiguous() for n, t in written.items()}, str(target / "model.safetensors"))
    for file in source.iterdir():
        if file.is_file() and not file.name.endswith(".safetensors") and file.name != "model.safetensors.index.json":
            shutil.copy2(file, target / file.name)
    return written


def _write_description(path: Path, config: QuantizeConfig, calib_tokens: int, written: dict) -> None:
    quantized, floats, parameters = _sizes(written.values())
    description = {
        "format": "ggml-blocks",
        "method": config.method,
        "bits": config.bits,
        "group_size": config.group_size,
        "symmetric": config.symmetric,
        "act_order": config.act_order,
        "damp": config.damp,
        "calibration": {"file": str(config.calib) if config.calib else None, "tokens": calib_tokens, "seq_len": config.seq_len},
        "bytes_per_parameter": (quantized + floats) / parameters,
        "tensors": {n: {"format": t.format.name, "cols": t.cols} for n, t in written.items() if isinstance(t, GGMLTensor)},
    }
    path.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")


def _sizes(tensors: Iterable[torch.Tensor | GGMLTensor]) -> tuple[int, int, int]:
    quantized = floats = parameters = 0
    for t in tensors:
        if isinstance(t, GGMLTensor):
            quantized += t.nbytes
            parameters += t.shape[0] * t.shape[1]
        else:
            floats += t.numel() * 4
            parameters += t.numel()
    return quantized, floats, parameters


def read_block_tensors(folder: Path, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor | GGMLTensor]]:
    """An HF folder's tensors, those `ember_quantization.json` lists as blocks wrapped as `GGMLTensor`s."""
    description = folder / QUANTIZATION_FILE
    listed = json.loads(description.read_text(encoding="utf-8"))["tensors"] if description.is_file() else {}
    for name, tensor in tensors:
        if name in listed:
            yield name, GGMLTensor(tensor, FORMATS[listed[name]["format"]], listed[name]["cols"])
        else:
            yield name, tensor
