"""Quantized checkpoints on disk: written by `ember quantize`, read back by ember's loader.

A GGUF source gives a GGUF file (`model.gguf`: the source's metadata and tokenizer, the
quantized matrices as Q4_0/Q4_1/Q8_0 tensors in llama.cpp's row order), which ember and
llama.cpp both read; NF4/FP8 matrices (and SmoothQuant's W8A8 rows: float32 scale + int8 codes) go in
as raw I8 rows named under EMBER_BLOCK_FORMATS_KEY (ember reads those, llama.cpp does not). An HF
folder gives `model.safetensors` (quantized tensors as uint8 rows, the rest float32) beside the
source's config and tokenizer files. Both get `ember_quantization.json`
(method, grid, calibration, which tensors are blocks). The folder is written under a temporary
name and renamed to --out only when complete, so a failure leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ember.config.model import ModelConfig
from ember.quant.config import QuantizeConfig
from ember.quant.ggml.blocks import FORMATS, GGUF_FORMATS, GGMLTensor
from ember.quant.int8.channel import Int8ChannelTensor

Quantized = GGMLTensor | Int8ChannelTensor

QUANTIZATION_FILE = "ember_quantization.json"
FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"), "w13": ("w1", "w3")}
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7}  # gguf.LlamaFileType
# GGUF key listing tensors in ember's own formats (NF4, FP8, W8A8), stored as raw I8 rows (of blocks, or scale + codes):
# a JSON object {gguf tensor name: format name}. llama.cpp cannot run such a file; ember's loader can.
EMBER_BLOCK_FORMATS_KEY = "ember.block_formats"


@dataclass(frozen=True)
class SourceNames:
    """The source checkpoint's tensors as the model names them: given by ember.models, which knows each family's
    naming, so that `write_quantized` writes every tensor back under the source's own name and layout."""

    model_names: dict[str, str | None]  # source tensor name -> the model's name for it; None: configuration, copied as is
    is_rope_interleaved: bool = False  # q/k rows stored in llama.cpp's interleaved rotary order (the GGUF loader undoes it)


def write_quantized(
    source: Path, names: SourceNames, model: nn.Module, model_config: ModelConfig, blocks: dict[str, Quantized],
    config: QuantizeConfig, calib_tokens: int, notes: dict | None = None,
) -> tuple[int, int, int]:
    """Write the checkpoint to config.out atomically; returns (quantized bytes, float bytes, parameters).
    `names`: the source's tensors as the model names them. `notes`: what the method found on the way (e.g. an alpha
    search's scores), added to the description."""
    tensors = checkpoint_tensors(model, model_config, blocks)
    partial = config.out.parent / f".{config.out.name}.partial-{os.getpid()}"
    partial.mkdir(parents=True)
    try:
        if source.is_file():
            written = _write_gguf(source, partial / "model.gguf", tensors, names, model_config, config.format_name)
        else:
            written = _write_safetensors(source, partial, tensors, names)
        _write_description(partial / QUANTIZATION_FILE, config, calib_tokens, written, notes or {})
        os.rename(partial, config.out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return _sizes(written.values())


def checkpoint_tensors(model: nn.Module, config: ModelConfig, blocks: dict[str, Quantized]) -> dict[str, torch.Tensor | Quantized]:
    """Checkpoint-named tensors: blocks where quantized, float elsewhere; a fused projection under its own name and
    split back into its parts (views), as a writer finds either in its source (Llama's q/k/v, Phi-3's qkv_proj)."""
    named: dict[str, torch.Tensor | Quantized] = {}
    for name, tensor in [*model.state_dict().items(), *blocks.items()]:
        if isinstance(tensor, torch.Tensor) and name in blocks:
            continue
        named.update(_split_fused(name, tensor, config))
    return named


def _split_fused(name: str, tensor: torch.Tensor | Quantized, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor | Quantized]]:
    yield name, tensor
    prefix, fused, kind = _name_parts(name)
    if fused not in FUSED_PARTS:
        return
    kv = config.num_kv_heads * config.head_dim
    # gate and up (an expert's w1 and w3) are halves of equal size, whatever the layer's width
    sizes = [config.num_heads * config.head_dim, kv, kv] if fused == "qkv_proj" else [tensor.shape[0] // 2] * 2
    start = 0
    for part, size in zip(FUSED_PARTS[fused], sizes, strict=True):
        if isinstance(tensor, GGMLTensor):
            piece: torch.Tensor | Quantized = GGMLTensor(tensor.data[start : start + size], tensor.format, tensor.cols)
        elif isinstance(tensor, Int8ChannelTensor):
            piece = tensor.row_range(start, start + size)
        else:
            piece = tensor[start : start + size]
        yield f"{prefix}{part}.{kind}", piece
        start += size


def _name_parts(name: str) -> tuple[str, str, str]:
    head, _, kind = name.rpartition(".")
    prefix, _, module = head.rpartition(".")
    return (f"{prefix}." if prefix else ""), module, kind


def _write_gguf(source: Path, target: Path, tensors: dict, names: SourceNames, config: ModelConfig,
                format_name: str) -> dict[str, torch.Tensor | Quantized]:
    from gguf import GGMLQuantizationType, GGUFWriter

    from ember.gguf_file import GGUFFile

    reader = GGUFFile.open(source)
    writer = GGUFWriter(str(target), reader.metadata["general.architecture"])
    reader.copy_metadata(writer, skip=("general.file_type",))
    if format_name in FILE_TYPES:
        writer.add_file_type(FILE_TYPES[format_name])
    ember_formats = {}
    written = {}
    for source_tensor in reader.tensors:
        name = names.model_names[source_tensor.name]
        if name is None:  # configuration, copied as it is
            writer.add_tensor(source_tensor.name, np.array(source_tensor.data))
            continue
        value = _llama_cpp_rows(source_tensor.name, tensors[name], config) if names.is_rope_interleaved else tensors[name]
        written[name] = tensors[name]
        if isinstance(value, GGMLTensor) and value.format.name in GGUF_FORMATS:
            raw = value.data.numpy()
            writer.add_tensor(source_tensor.name, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType[value.format.name])
        elif not isinstance(value, torch.Tensor):  # ember's own formats: raw I8 rows
            ember_formats[source_tensor.name] = format_of(value)
            writer.add_tensor(source_tensor.name, stored_bytes(value).numpy().view(np.int8), raw_dtype=GGMLQuantizationType.I8)
        else:
            writer.add_tensor(source_tensor.name, np.ascontiguousarray(value.float().numpy()))
    if ember_formats:
        writer.add_string(EMBER_BLOCK_FORMATS_KEY, json.dumps(ember_formats))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def _llama_cpp_rows(gguf_name: str, value: torch.Tensor | Quantized, config: ModelConfig) -> torch.Tensor | Quantized:
    """q/k rows back in llama.cpp's interleaved rotary order (what the GGUF loader undoes)."""
    if not gguf_name.endswith(("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias")):
        return value
    heads = config.num_heads if "attn_q" in gguf_name else config.num_kv_heads
    rows = value.shape[0]
    order = torch.arange(rows).reshape(heads, 2, rows // heads // 2).transpose(1, 2).reshape(rows)
    return value[order] if isinstance(value, torch.Tensor) else value.rows(order)


def _write_safetensors(source: Path, target: Path, tensors: dict, source_names: SourceNames) -> dict[str, torch.Tensor | Quantized]:
    from safetensors.torch import save_file

    names = list(source_names.model_names)
    unknown = [name for name in names if name not in tensors]
    if unknown:
        raise ValueError(f"the model has no tensor for the checkpoint's {unknown[0]!r}, so ember quantize cannot write this "
                         "checkpoint back; quantize a checkpoint whose tensors keep the family's own names")
    written = {name: tensors[name] for name in names}
    save_file({n: t.float().contiguous() if isinstance(t, torch.Tensor) else stored_bytes(t) for n, t in written.items()},
              str(target / "model.safetensors"))
    for file in source.iterdir():
        if file.is_file() and not file.name.endswith(".safetensors") and file.name != "model.safetensors.index.json":
            shutil.copy2(file, target / file.name)
    return written


def _write_description(path: Path, config: QuantizeConfig, calib_tokens: int, written: dict, notes: dict) -> None:
    quantized, floats, parameters = _sizes(written.values())
    description = {
        "format": "ggml-blocks",
        "method": config.method,
        "bits": config.bits,
        "group_size": config.group_size,
        "symmetric": config.symmetric,
        "act_order": config.act_order,
        "damp": config.damp,
        "alpha": config.alpha,
        "calibration": {"file": str(config.calib) if config.calib else None, "tokens": calib_tokens, "seq_len": config.seq_len},
        "bytes_per_parameter": (quantized + floats) / parameters,
        "tensors": {n: {"format": format_of(t), "cols": t.shape[1]} for n, t in written.items() if not isinstance(t, torch.Tensor)},
        **notes,
    }
    path.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")


def _sizes(tensors: Iterable[torch.Tensor | Quantized]) -> tuple[int, int, int]:
    quantized = floats = parameters = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            quantized += t.nbytes
            parameters += t.shape[0] * t.shape[1]
        else:
            floats += t.numel() * 4
            parameters += t.numel()
    return quantized, floats, parameters


def format_of(tensor: Quantized) -> str:
    """The format name a quantized tensor is listed under (ember_quantization.json, the GGUF key ember.block_formats)."""
    return tensor.format.name if isinstance(tensor, GGMLTensor) else tensor.format_name


def stored_bytes(tensor: Quantized) -> torch.Tensor:
    """uint8 [rows, bytes per row]: a quantized tensor as the files hold it."""
    return tensor.data if isinstance(tensor, GGMLTensor) else tensor.stored()


def read_block_tensors(folder: Path, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor | Quantized]]:
    """An HF folder's tensors, those `ember_quantization.json` lists as blocks wrapped as `GGMLTensor`s (W8A8 rows as
    `Int8ChannelTensor`s)."""
    description = folder / QUANTIZATION_FILE
    listed = json.loads(description.read_text(encoding="utf-8"))["tensors"] if description.is_file() else {}
    for name, tensor in tensors:
        if name in listed and listed[name]["format"] == Int8ChannelTensor.format_name:
            yield name, Int8ChannelTensor.from_stored(tensor)
        elif name in listed:
            yield name, GGMLTensor(tensor, FORMATS[listed[name]["format"]], listed[name]["cols"])
        else:
            yield name, tensor
