"""The protobuf wire format, just enough to read and write SentencePiece `.model` files
without generated code: varints, 32-bit floats and length-delimited fields."""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


def read_varint(data: bytes, offset: int) -> tuple[int, int]:
    """(value, next offset) of the varint at `offset`."""
    value = 0
    shift = 0
    while True:
        if offset >= len(data):
            raise ValueError("protobuf message ends inside a varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
        shift += 7


def iter_fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of a message; length-delimited values
    are bytes, fixed32/fixed64 values are their raw little-endian integers."""
    offset = 0
    while offset < len(data):
        key, offset = read_varint(data, offset)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            value, offset = read_varint(data, offset)
        elif wire_type == LENGTH_DELIMITED:
            length, offset = read_varint(data, offset)
            value = data[offset : offset + length]
            if len(value) != length:
                raise ValueError("protobuf message ends inside a length-delimited field")
            offset += length
        elif wire_type == FIXED32:
            (value,) = struct.unpack_from("<I", data, offset)
            offset += 4
        elif wire_type == FIXED64:
            (value,) = struct.unpack_from("<Q", data, offset)
            offset += 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        yield number, wire_type, value


def as_float(raw: int) -> float:
    """A fixed32 field's value read as float."""
    return struct.unpack("<f", struct.pack("<I", raw))[0]


def as_signed(value: int) -> int:
    """An int32/int64 varint read as signed (negative numbers use 10-byte two's complement)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_varint(number: int, value: int) -> bytes:
    return encode_varint(number << 3 | VARINT) + encode_varint(int(value))


def field_bytes(number: int, value: bytes | str) -> bytes:
    data = value.encode("utf-8") if isinstance(value, str) else value
    return encode_varint(number << 3 | LENGTH_DELIMITED) + encode_varint(len(data)) + data


def field_float(number: int, value: float) -> bytes:
    return encode_varint(number << 3 | FIXED32) + struct.pack("<f", value)
