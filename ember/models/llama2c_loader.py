"""llama2.c checkpoints (.bin, legacy and version 1): a header of ints, then float32 weights."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ember.config.model import ModelConfig

_V1_MAGIC = 0x616B3432  # "ak42"
_V1_HEADER_BYTES = 256


@dataclass(frozen=True)
class Llama2cHeader:
    """The checkpoint's shape and where its weights begin."""

    dim: int
    hidden_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_seq_len: int
    shared_classifier: bool
    version: int
    weights_offset: int


def read_llama2c_header(path: Path) -> Llama2cHeader:
    with open(path, "rb") as f:
        head = f.read(_V1_HEADER_BYTES)
    if len(head) < 28:
        raise ValueError(f"{path} is too short to be a llama2.c checkpoint")
    magic, version = struct.unpack("<Ii", head[:8])
    if magic == _V1_MAGIC:
        if version != 1:
            raise ValueError(f"{path}: llama2.c format version {version} is not supported (only 0 and 1)")
        values = struct.unpack("<7i", head[8:36])
        shared = bool(head[36])
        return Llama2cHeader(*values, shared_classifier=shared, version=1, weights_offset=_V1_HEADER_BYTES)
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", head[:28])
    if min(dim, hidden, layers, heads, kv_heads, seq_len) <= 0 or dim % heads:
        raise ValueError(f"{path} is not a llama2.c checkpoint (its header makes no sense)")
    return Llama2cHeader(dim, hidden, layers, heads, kv_heads, abs(vocab), seq_len, vocab > 0, 0, 28)


def is_llama2c_file(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        header = read_llama2c_header(path)
    except ValueError:
        return False
    expected = _weights_bytes(header)
    return path.stat().st_size - header.weights_offset >= expected


def llama2c_config(header: Llama2cHeader) -> ModelConfig:
    return ModelConfig(
        architecture="llama",
        vocab_size=header.vocab_size,
        hidden_size=header.dim,
        intermediate_size=header.hidden_dim,
        num_layers=header.num_layers,
        num_heads=header.num_heads,
        num_kv_heads=header.num_kv_heads,
        head_dim=header.dim // header.num_heads,
        max_position_embeddings=header.max_seq_len,
        rms_norm_eps=1e-5,
        tie_word_embeddings=header.shared_classifier,
    )


def _layout(h: Llama2cHeader) -> list[tuple[str, tuple[int, ...]]]:
    """The order and shapes of the stored tensors, with transformers' names (`{i}` = per layer)."""
    kv_dim = h.num_kv_heads * (h.dim // h.num_heads)
    layer = "model.layers.{i}."
    per_layer_attn = [
        (layer + "self_attn.q_proj.weight", (h.dim, h.dim)),
        (layer + "self_attn.k_proj.weight", (kv_dim, h.dim)),
        (layer + "self_attn.v_proj.weight", (kv_dim, h.dim)),
        (layer + "self_attn.o_proj.weight", (h.dim, h.dim)),
    ]
    per_layer_ffn = [
        (layer + "mlp.gate_proj.weight", (h.hidden_dim, h.dim)),
        (layer + "mlp.down_proj.weight", (h.dim, h.hidden_dim)),
        (layer + "mlp.up_proj.weight", (h.hidden_dim, h.dim)),
    ]
    embed = ("model.embed_tokens.weight", (h.vocab_size, h.dim))
    attn_norm = (layer + "input_layernorm.weight", (h.dim,))
    ffn_norm = (layer + "post_attention_layernorm.weight", (h.dim,))
    final_norm = ("model.norm.weight", (h.dim,))
    if h.version == 1:
        order = [attn_norm, ffn_norm, final_norm, embed, *per_layer_attn, *per_layer_ffn]
    else:
        order = [embed, attn_norm, *per_layer_attn, ffn_norm, *per_layer_ffn, final_norm]
        head_size = h.dim // h.num_heads
        order.append(("freq_cis", (2, h.max_seq_len, head_size // 2)))  # precomputed rope, unused
    if not h.shared_classifier:
        order.append(("lm_head.weight", (h.vocab_size, h.dim)))
    return order


def _weights_bytes(h: Llama2cHeader) -> int:
    total = 0
    for name, shape in _layout(h):
        count = int(np.prod(shape)) * (h.num_layers if "{i}" in name else 1)
        total += 4 * count
    return total


def iter_llama2c_tensors(path: Path, header: Llama2cHeader) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers name, float32 tensor) pairs; q/k rows permuted to the half-split rotary layout."""
    data = np.memmap(path, dtype=np.float32, mode="r", offset=header.weights_offset)
    head_dim = header.dim // header.num_heads
    cursor = 0
    for name, shape in _layout(header):
        copies = header.num_layers if "{i}" in name else 1
        for i in range(copies):
            count = int(np.prod(shape))
            values = np.array(data[cursor : cursor + count]).reshape(shape)
            cursor += count
            if name == "freq_cis":
                continue
            full_name = name.format(i=i)
            if full_name.endswith("q_proj.weight"):
                values = _to_half_split(values, header.num_heads, head_dim)
            elif full_name.endswith("k_proj.weight"):
                values = _to_half_split(values, header.num_kv_heads, head_dim)
            yield full_name, torch.from_numpy(values)


def _to_half_split(weight: np.ndarray, num_heads: int, head_dim: int) -> np.ndarray:
    """Rows of each head reordered from interleaved rotary pairs to [evens, odds]."""
    shaped = weight.reshape(num_heads, head_dim // 2, 2, weight.shape[1])
    return np.ascontiguousarray(shaped.swapaxes(1, 2).reshape(weight.shape))
