"""A small reader of the key/value metadata at the head of a GGUF file.

It stops before the tensor index, so reading a tokenizer from a multi-GB model file costs a
fraction of a second (the gguf package's GGUFReader maps every tensor first, seconds here).
Layout (little-endian): "GGUF", u32 version (2 or 3), u64 tensor count, u64 key/value count,
then per entry: string key, u32 value type, value; strings are u64 length + UTF-8 bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

GGUF_MAGIC = b"GGUF"

# value type -> struct format of one scalar
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle

    def take(self, size: int) -> bytes:
        data = self._handle.read(size)
        if len(data) != size:
            raise ValueError("GGUF file ends inside its metadata (truncated download?)")
        return data

    def scalar(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("Q")).decode("utf-8", errors="surrogateescape")

    def value(self, value_type: int) -> Any:
        if value_type in _SCALARS:
            return self.scalar(_SCALARS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type = self.scalar("I")
            count = self.scalar("Q")
            if item_type in _SCALARS:
                fmt = _SCALARS[item_type]
                return list(
                    struct.unpack(f"<{count}{fmt}", self.take(count * struct.calcsize(fmt)))
                )
            return [self.value(item_type) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {value_type}; the file may be corrupt")


def read_gguf_metadata(path: str | Path, prefixes: tuple[str, ...] = ("",)) -> dict[str, Any]:
    """All metadata entries of the GGUF file at `path` whose keys start with one of `prefixes`."""
    with Path(path).open("rb") as handle:
        reader = _Reader(handle)
        if reader.take(4) != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
        version = reader.scalar("I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
        reader.scalar("Q")  # tensor count
        entry_count = reader.scalar("Q")
        metadata: dict[str, Any] = {}
        for _ in range(entry_count):
            key = reader.string()
            value = reader.value(reader.scalar("I"))
            if key.startswith(prefixes):
                metadata[key] = value
        return metadata
