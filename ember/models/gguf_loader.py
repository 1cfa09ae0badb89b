"""GGUF model files: metadata -> ModelConfig, tensors renamed to transformers' names.

Matrices in a block format ember executes (ember.quant.ggml.blocks.FORMATS) come out as
`GGMLTensor`s, still in their blocks (IQ4_NL re-coded as Q8_0, exactly), and W8A8 rows (written by `ember quantize
--method smoothquant`) as `Int8ChannelTensor`s; every other tensor is dequantized to float32 here, including the
types ember has no kernel for (the other i-quants, ternary and FP4 types), which then cost a float copy's memory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from ember.config.model import ModelConfig, RopeScaling
from ember.gguf_file import GGUF_MAGIC, GGUFFile, GGUFTensor
from ember.models.family_registry import config_from_gguf, family_of
from ember.models.family_spec import GGUFReading
from ember.quant.checkpoint import EMBER_BLOCK_FORMATS_KEY, SourceNames
from ember.quant.ggml.blocks import FORMATS, GGMLTensor
from ember.quant.ggml.iq4_nl import iq4_nl_rows_as_q8_0
from ember.quant.int8.channel import FORMAT_NAME as INT8_ROWS_FORMAT
from ember.quant.int8.channel import Int8ChannelTensor
from ember.quant.parts import quantized_part

logger = logging.getLogger(__name__)

# Tensor types ember reads: those in FORMATS (every quantized type here) run in their blocks, the float ones load as floats.
SUPPORTED_TYPES = {
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q2_K,
    GGMLQuantizationType.Q3_K,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.IQ4_NL,  # re-coded as Q8_0 blocks
}
# Types without an ember kernel that the gguf package decodes: loaded as float32.
_FLOAT_FALLBACK_NAMES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4")
FLOAT_FALLBACK_TYPES = frozenset(GGMLQuantizationType[n] for n in _FLOAT_FALLBACK_NAMES if n in GGMLQuantizationType.__members__)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",  # stored fused (phi3)
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Every expert's matrix of a layer stacked in one 3-D tensor, split here into one tensor per expert (`split_experts`).
_EXPERT_STACK = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight")
_ROUTER = re.compile(r"blk\.(\d+)\.ffn_gate_inp\.weight")
_ONE_EXPERT = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.(\d+)\.weight")
_EXPERT_NAMES = ("mlp.experts", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})  # unless a family names its own
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output_norm.bias": "model.norm.bias",  # a LayerNorm's (StarCoder2)
    "output.weight": "lm_head.weight",
    "output.bias": "lm_head.bias",  # Phi's head has one
}
# Per-pair rotary frequency divisors (Llama 3.1's scaling as llama.cpp's converter writes it, and Phi-3's LongRoPE
# short and long ones): config, not weights.
ROPE_FREQS_TENSOR = "rope_freqs.weight"
LONGROPE_TENSORS = ("rope_factors_short.weight", "rope_factors_long.weight")
ROPE_CONFIG_TENSORS = (ROPE_FREQS_TENSOR, *LONGROPE_TENSORS)
_LAYER_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def is_gguf_file(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def read_gguf_config(file: GGUFFile) -> ModelConfig:
    """The model's configuration from the file's metadata (and its tensors, where they are the better source)."""
    metadata = {name: value for name, value in file.metadata.items() if not name.startswith("tokenizer.ggml.")}
    if "tokenizer.ggml.tokens" in file.metadata:
        metadata["tokenizer.ggml.tokens"] = range(len(file.metadata["tokenizer.ggml.tokens"]))
    embedding = next((t for t in file.tensors if t.name == "token_embd.weight"), None)
    if embedding is not None:  # the embedding's rows are the vocabulary, whatever the metadata says
        metadata[f"{metadata['general.architecture']}.vocab_size"] = int(embedding.shape[1])
    config = _with_dense_layers(config_from_gguf(metadata, frozenset(t.name for t in file.tensors)), file)
    factors = {t.name: tuple(dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1).tolist())
               for t in file.tensors if t.name in ROPE_CONFIG_TENSORS}
    if ROPE_FREQS_TENSOR in factors:
        return dataclasses.replace(config, rope_scaling=RopeScaling("frequency_factors", frequency_factors=factors[ROPE_FREQS_TENSOR]))
    if any(name in factors for name in LONGROPE_TENSORS):
        return dataclasses.replace(config, rope_scaling=_gguf_longrope(metadata, config, factors))
    return config


def _with_dense_layers(config: ModelConfig, file: GGUFFile) -> ModelConfig:
    """A mixture-of-experts config whose layers without a router in the file (no ffn_gate_inp) run a plain MLP."""
    if config.moe is None:
        return config
    routed = {int(match.group(1)) for t in file.tensors if (match := _ROUTER.fullmatch(t.name))}
    dense = tuple(layer for layer in range(config.num_layers) if layer not in routed)
    return dataclasses.replace(config, moe=dataclasses.replace(config.moe, dense_layers=dense))


def _gguf_longrope(metadata: dict, config: ModelConfig, factors: dict[str, tuple[float, ...]]) -> RopeScaling:
    """Phi-3's LongRoPE as llama.cpp's converter stores it: both factor tensors, the original context, the attention factor."""
    arch = metadata["general.architecture"]
    missing = [name for name in LONGROPE_TENSORS if name not in factors]
    if missing:
        raise ValueError(f"this GGUF's LongRoPE lacks {missing[0]}: it needs both the short and the long factor tensors")
    original = int(metadata.get(f"{arch}.rope.scaling.original_context_length") or config.max_position_embeddings)
    growth = config.max_position_embeddings / original
    computed = 1.0 if growth <= 1.0 else math.sqrt(1 + math.log(growth) / math.log(original))
    return RopeScaling("longrope", original_max_position_embeddings=original,
                       attention_factor=float(metadata.get(f"{arch}.rope.scaling.attn_factor") or computed),
                       frequency_factors=factors[LONGROPE_TENSORS[0]], long_frequency_factors=factors[LONGROPE_TENSORS[1]])


def hf_name(gguf_name: str, reading: GGUFReading) -> str:
    """GGUF tensor name -> transformers' name (e.g. blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight) in a
    model of the family that reads the file (`reading`: some store parts fused under a plain part's name)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    expert = _ONE_EXPERT.fullmatch(gguf_name)
    if expert is not None:
        layer, part, index = expert.groups()
        prefix, parts = reading.expert_names or _EXPERT_NAMES
        return f"model.layers.{layer}.{prefix}.{index}.{parts[part]}.weight"
    match = _LAYER_PATTERN.fullmatch(gguf_name)
    names = {**_LAYER_NAMES, **reading.layer_names}
    if match is None or match.group(2) not in names:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no counterpart in ember's Llama model")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{names[part]}.{kind}"


def gguf_reading(config: ModelConfig) -> GGUFReading:
    """How the family of `config` reads GGUF files (a family that reads none has no GGUF to load)."""
    reading = family_of(config.architecture).gguf
    if reading is None:
        raise ValueError(f"{config.architecture} models are read from HF folders only: ember reads no GGUF of theirs")
    return reading


def gguf_source_names(file: GGUFFile, config: ModelConfig) -> SourceNames:
    """The file's tensors as the model names them (its rotary tables: configuration), for writing it back quantized."""
    reading = gguf_reading(config)
    names = {t.name: None if t.name in ROPE_CONFIG_TENSORS else hf_name(t.name, reading) for t in file.tensors}
    return SourceNames(names, is_rope_interleaved=reading.is_rope_interleaved)


def unpermute_rope(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs -> transformers' half split)."""
    rows = weight.shape[0]
    head_dim = rows // num_heads
    shaped = weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
    return shaped.swapaxes(1, 2).reshape(weight.shape)


# (transformers name) -> (dim, start, stop) of the part to load, or None for the whole tensor.
SliceSelector = Callable[[str], tuple[int, int, int] | None]


def iter_gguf_tensors(
    file: GGUFFile, config: ModelConfig, select: SliceSelector | None = None, keep: Callable[[str], bool] | None = None,
    float_parts: bool = False,
) -> Iterator[tuple[str, torch.Tensor | GGMLTensor | Int8ChannelTensor]]:
    """(transformers name, tensor) pairs, one at a time: `GGMLTensor` for executed block formats, `Int8ChannelTensor`
    for W8A8 rows, float32 otherwise.

    With `select` (a tensor-parallel rank), only the selected rows or columns are kept: rows are all that is read,
    and a part stays in its blocks (ember.quant.parts: columns on block boundaries, else an error naming the
    shape), or with `float_parts` is dequantized to float32 (any column split). Tensors `keep` says no to are
    skipped unread.
    """
    reading = gguf_reading(config)
    permute_rope = reading.is_rope_interleaved
    ember_formats = ember_block_formats(file)
    _check_tensor_types(file, ember_formats)
    for tensor in split_experts(file.tensors):
        if tensor.name in ROPE_CONFIG_TENSORS:
            continue  # read into the config (read_gguf_config)
        name = hf_name(tensor.name, reading)
        if keep is not None and not keep(name):
            continue  # another rank's layer or expert
        part = select(name) if select is not None else None
        is_iq4_nl = tensor.tensor_type == GGMLQuantizationType.IQ4_NL and len(tensor.shape) == 2
        stored_format = "Q8_0" if is_iq4_nl else ember_formats.get(tensor.name, tensor.tensor_type.name)
        block_format = FORMATS.get(stored_format) if len(tensor.shape) == 2 else None
        is_int8_rows = stored_format == INT8_ROWS_FORMAT
        is_rope_part = permute_rope and tensor.name.endswith(("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias"))
        if part is not None and (float_parts or (block_format is None and not is_int8_rows)):
            values = _ember_blocks_part(tensor, ember_formats[tensor.name], *part) if tensor.name in ember_formats else _dequantized_part(tensor, *part)
            if is_rope_part:
                values = unpermute_rope(values, values.shape[0] // config.head_dim)  # whole heads, sliced or not
            yield name, torch.from_numpy(np.array(values, dtype=np.float32, order="C", copy=True))
            continue
        if block_format is not None or is_int8_rows:  # rows of blocks (or of W8A8 scale + codes): uint8 [rows, bytes per row]
            values = np.asarray(tensor.data).view(np.uint8).reshape(int(tensor.shape[1]), -1)
            if part is not None and part[0] == 0:
                values = values[part[1] : part[2]]  # this rank's rows, the only ones read
            values = iq4_nl_rows_as_q8_0(values) if is_iq4_nl else values
            cols = 0 if is_int8_rows else values.shape[1] // block_format.block_bytes * block_format.block_values
        else:
            values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
            values = values.reshape([int(d) for d in reversed(tensor.shape)])
        if reading.has_unit_offset_norms and tensor.name.endswith("norm.weight"):
            values = values - 1
        if tensor.name.endswith("ffn_gate_inp_shexp.weight"):
            values = values.reshape(1, -1)  # one output: llama.cpp stores it as a vector
        if is_rope_part and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
            values = unpermute_rope(values, config.num_heads if part is None else values.shape[0] // config.head_dim)
        elif is_rope_part:
            values = unpermute_rope(values, config.num_kv_heads if part is None else values.shape[0] // config.head_dim)
        # A copy, never a view: the file map is read-only and is closed after loading.
        values = torch.from_numpy(np.array(values, order="C", copy=True))
        if is_int8_rows:
            weight: torch.Tensor | GGMLTensor | Int8ChannelTensor = Int8ChannelTensor.from_stored(values)
        elif block_format is not None:
            weight = GGMLTensor(values, block_format, cols)
        else:
            weight = values
        if part is not None and part[0] == 1:
            weight = quantized_part(weight, *part, name)  # a row-parallel rank's input columns, whole blocks
        yield name, weight


def split_experts(tensors: list[GGUFTensor]) -> Iterator[GGUFTensor]:
    """The file's tensors, each 3-D stack of a layer's expert matrices as one 2-D tensor per expert (its rows of the
    stack: views of the file, nothing copied), named blk.N.ffn_{gate,up,down}_exps.E.weight."""
    for tensor in tensors:
        if _EXPERT_STACK.fullmatch(tensor.name) is None or len(tensor.shape) != 3:
            yield tensor
            continue
        stem = tensor.name.removesuffix(".weight")
        for expert in range(int(tensor.shape[2])):
            yield GGUFTensor(f"{stem}.{expert}.weight", tensor.shape[:2], tensor.tensor_type, tensor.data[expert])


def _check_tensor_types(file: GGUFFile, ember_formats: dict[str, str]) -> None:
    """Refuse a type nothing here decodes, by name; say once which types load as float (their memory is a float copy's)."""
    types = {t.tensor_type for t in file.tensors if t.name not in ember_formats}
    unknown = sorted(t.name for t in types - SUPPORTED_TYPES - FLOAT_FALLBACK_TYPES)
    if unknown:
        holder = next(t.name for t in file.tensors if t.tensor_type.name == unknown[0])
        raise ValueError(f"GGUF tensor {holder} has type {unknown[0]}, which ember cannot load; supported: "
                         f"{', '.join(sorted(t.name for t in SUPPORTED_TYPES | FLOAT_FALLBACK_TYPES))}")
    fallback = sorted(t.name for t in types & FLOAT_FALLBACK_TYPES)
    if fallback:
        logger.warning("GGUF tensors of type %s have no ember kernel: dequantized to float32 at load (a float copy's memory)",
                       ", ".join(fallback))


def ember_block_formats(file: GGUFFile) -> dict[str, str]:
    """{tensor name: format} of the tensors stored in ember's own block formats (written by `ember quantize`)."""
    stored = file.metadata.get(EMBER_BLOCK_FORMATS_KEY)
    if stored is None:
        return {}
    formats = json.loads(stored)
    unknown = sorted(set(formats.values()) - {*FORMATS, INT8_ROWS_FORMAT})
    if unknown:
        raise ValueError(f"this GGUF holds tensors in block formats {', '.join(unknown)}, which this ember cannot run; upgrade ember")
    return formats


def _ember_blocks_part(tensor: GGUFTensor, format_name: str, dim: int, start: int, stop: int) -> np.ndarray:
    """Rows or columns [start, stop) of a tensor in ember's own blocks, dequantized to float32."""
    raw = torch.from_numpy(np.asarray(tensor.data).view(np.uint8).reshape(int(tensor.shape[1]), -1).copy())
    if format_name == INT8_ROWS_FORMAT:
        values = Int8ChannelTensor.from_stored(raw).dequantize().numpy()
    else:
        block_format = FORMATS[format_name]
        values = GGMLTensor(raw, block_format, raw.shape[1] // block_format.block_bytes * block_format.block_values).dequantize().numpy()
    return values[start:stop] if dim == 0 else values[:, start:stop]


def _dequantized(tensor: GGUFTensor, rows: slice = slice(None)) -> np.ndarray:
    """Float32 values of `tensor` (rows `rows` of it), in torch's [out, in] order."""
    shape = [int(d) for d in reversed(tensor.shape)]
    data = tensor.data[rows] if len(shape) > 1 else tensor.data
    values = dequantize(data, tensor.tensor_type).astype(np.float32, copy=False)
    return values.reshape([-1, *shape[1:]]) if len(shape) > 1 else values.reshape(shape)


def _dequantized_part(tensor: GGUFTensor, dim: int, start: int, stop: int) -> np.ndarray:
    """Rows or columns [start, stop) of `tensor`, reading only their bytes when the blocks allow."""
    if dim == 0:
        return _dequantized(tensor, slice(start, stop)) if len(tensor.shape) > 1 else _dequantized(tensor)[start:stop]
    if tensor.data.dtype != np.uint8:  # F32 / F16 data are typed arrays: columns are elements
        return tensor.data[:, start:stop].astype(np.float32)
    block_size, block_bytes = GGML_QUANT_SIZES[tensor.tensor_type]
    if start % block_size or stop % block_size:
        return _dequantized(tensor)[:, start:stop]
    data = tensor.data[:, start // block_size * block_bytes : stop // block_size * block_bytes]
    return dequantize(np.ascontiguousarray(data), tensor.tensor_type).astype(np.float32, copy=False).reshape(data.shape[0], -1)
