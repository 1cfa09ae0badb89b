"""Piece kinds shared by SentencePiece `.model` files, GGUF `token_type` and llama2.c vocabularies."""

from __future__ import annotations

from enum import IntEnum

import regex

BYTE_PIECE = regex.compile(r"<0x([0-9A-Fa-f]{2})>")


class PieceKind(IntEnum):
    """The type of a vocabulary entry; the numbers are those of sentencepiece and GGUF."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


def byte_of_piece(piece: str) -> int | None:
    """The byte a `<0xNN>` byte-fallback piece stands for, None for any other piece."""
    match = BYTE_PIECE.fullmatch(piece)
    return int(match.group(1), 16) if match else None
