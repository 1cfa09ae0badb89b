"""GGUF files read fast: the key/value metadata, the tensor index, and each tensor's bytes mapped from the file.

Layout (little-endian): "GGUF", u32 version (2 or 3), u64 tensor count, u64 key/value count; per
entry a string key, u32 value type and the value (strings: u64 length + UTF-8 bytes; arrays: u32
item type, u64 count, items); then per tensor its name, u32 dimension count, u64 dimensions (the
contiguous one first), u32 GGML type and u64 offset into the data section, which starts at the next
multiple of `general.alignment` (default 32) after the index.

The gguf package's GGUFReader builds numpy views item by item, which on a vocabulary of 151,936
tokens (and as many merges, Qwen2.5's) takes seconds before a model can load. This reader walks the
header once over a memory map and maps each tensor's bytes as one numpy view, typed as GGUFReader
types them (float32/float16/integer arrays for plain types, rows of bytes for block formats), so
code written against either reads the same arrays.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# value type -> struct format of one scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# GGML types whose data GGUFReader hands out as typed elements (every other type: rows of bytes)
_TYPED = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class _Cursor:
    """Reads little-endian values front to back from a buffer (the file's memory map)."""

    def __init__(self, buffer, what: str) -> None:
        self.buffer = buffer
        self.offset = 0
        self.what = what

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.buffer):
            raise ValueError(f"{self.what} ends inside its header (truncated download?)")
        value = struct.unpack_from("<" + fmt, self.buffer, self.offset)[0]
        self.offset += size
        return value

    def string(self) -> str:
        length = self.scalar("Q")
        if self.offset + length > len(self.buffer):
            raise ValueError(f"{self.what} ends inside its header (truncated download?)")
        text = self.buffer[self.offset : self.offset + length].decode("utf-8", errors="surrogateescape")
        self.offset += length
        return text

    def value(self, value_type: int) -> Any:
        if value_type in _SCALARS:
            return self.scalar(_SCALARS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.scalar("I"), self.scalar("Q")
            if item_type in _SCALARS:
                fmt = f"<{count}{_SCALARS[item_type]}"
                values = list(struct.unpack_from(fmt, self.buffer, self.offset))
                self.offset += struct.calcsize(fmt)
                return values
            return [self.value(item_type) for _ in range(count)]
        raise ValueError(f"{self.what}: unknown GGUF value type {value_type}; the file may be corrupt")

    def entry(self) -> tuple[str, Any, GGUFValueType, GGUFValueType | None]:
        """One key/value entry: (key, value, value type, item type of an array)."""
        key = self.string()
        value_type = self.scalar("I")
        item_type = None
        if value_type == _ARRAY:  # peek: the value starts with its item type
            item_type = GGUFValueType(struct.unpack_from("<I", self.buffer, self.offset)[0])
        return key, self.value(value_type), GGUFValueType(value_type), item_type

    def header(self) -> tuple[int, int]:
        """(tensor count, key/value count) after checking the magic and version."""
        if bytes(self.buffer[:4]) != GGUF_MAGIC:
            raise ValueError(f"{self.what} is not a GGUF file (no GGUF magic)")
        self.offset = 4
        version = self.scalar("I")
        if version not in (2, 3):
            raise ValueError(f"{self.what}: GGUF version {version} is not supported (2 and 3 are)")
        return self.scalar("Q"), self.scalar("Q")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the index: `shape` in GGUF order (the contiguous dimension first), `data` mapped from the file."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    data: np.ndarray

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's metadata (every key, as Python values) and tensors (read-only views of the mapped file).

    `value_types` keeps each key's GGUF value type (and an array's item type), so a writer can copy the metadata as it was.
    """

    path: Path
    metadata: dict[str, Any]
    value_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]]
    tensors: list[GGUFTensor]

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        path = Path(path)
        with open(path, "rb") as handle:
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        cursor = _Cursor(buffer, str(path))
        tensor_count, entry_count = cursor.header()
        metadata, value_types = {}, {}
        for _ in range(entry_count):
            key, value, value_type, item_type = cursor.entry()
            metadata[key], value_types[key] = value, (value_type, item_type)
        index = [_tensor_entry(cursor) for _ in range(tensor_count)]
        alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-cursor.offset // alignment) * alignment
        whole = np.frombuffer(buffer, dtype=np.uint8)
        tensors = [_mapped(whole, data_start, entry, str(path)) for entry in index]
        return cls(path, metadata, value_types, tensors)

    def copy_metadata(self, writer, skip: tuple[str, ...] = ()) -> None:
        """Add every metadata entry but `skip` (and general.architecture, which the writer was made with) to a GGUFWriter."""
        for key, value in self.metadata.items():
            if key not in skip and key != "general.architecture":
                value_type, item_type = self.value_types[key]
                writer.add_key_value(key, value, value_type, sub_type=item_type)


def _tensor_entry(cursor: _Cursor) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
    name = cursor.string()
    shape = tuple(cursor.scalar("Q") for _ in range(cursor.scalar("I")))
    type_id = cursor.scalar("I")
    try:
        tensor_type = GGMLQuantizationType(type_id)
    except ValueError:
        raise ValueError(f"{cursor.what}: tensor {name} has GGML type {type_id}, which the gguf package does not know") from None
    return name, shape, tensor_type, cursor.scalar("Q")


def _mapped(whole: np.ndarray, data_start: int, entry: tuple, what: str) -> GGUFTensor:
    """The tensor's bytes as GGUFReader shapes them: reversed dimensions, block formats as rows of bytes."""
    name, shape, tensor_type, offset = entry
    block_size, type_size = GGML_QUANT_SIZES[tensor_type]
    elements = int(np.prod(shape, dtype=np.int64))
    n_bytes = elements // block_size * type_size
    start = data_start + offset
    if start + n_bytes > whole.size:
        raise ValueError(f"{what}: tensor {name} runs past the end of the file (truncated download?)")
    raw = whole[start : start + n_bytes]
    dims = list(reversed(shape))
    if tensor_type in _TYPED:
        return GGUFTensor(name, shape, tensor_type, raw.view(_TYPED[tensor_type]).reshape(dims))
    dims[-1] = dims[-1] // block_size * type_size
    return GGUFTensor(name, shape, tensor_type, raw.reshape(dims))


def read_gguf_metadata(path: str | Path, prefixes: tuple[str, ...] = ("",)) -> dict[str, Any]:
    """The metadata entries of the GGUF file at `path` whose keys start with one of `prefixes` (the tensor index unread)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        cursor = _Cursor(buffer, str(path))
        _, entry_count = cursor.header()
        metadata = {}
        for _ in range(entry_count):
            key = cursor.string()
            value = cursor.value(cursor.scalar("I"))
            if key.startswith(prefixes):
                metadata[key] = value
        return metadata
