"""SentencePiece text normalisation, including compiled rules (`precompiled_charsmap`).

A `.model` file made with a normalisation rule such as "nmt_nfkc" (sentencepiece's default)
carries its rules compiled: a little-endian u32 size, a darts-clone double-array trie of that
many bytes mapping UTF-8 input prefixes to offsets, then a blob of NUL-terminated
replacement strings. At each position the longest matching prefix is replaced; text no rule
matches is kept one character at a time. Whitespace handling follows sentencepiece's
normaliser: leading spaces dropped, runs of spaces collapsed, trailing markers stripped
(with remove_extra_whitespaces), a dummy-prefix marker, spaces escaped as `▁`.
"""

from __future__ import annotations

import struct
from array import array

SPACE_MARKER = "\u2581"


class CharsMap:
    """The compiled rules: longest-prefix replacement over UTF-8 bytes."""

    def __init__(self, blob: bytes) -> None:
        if len(blob) < 4:
            raise ValueError("precompiled_charsmap is too short")
        (trie_size,) = struct.unpack_from("<I", blob, 0)
        if trie_size % 4 or 4 + trie_size > len(blob):
            raise ValueError("precompiled_charsmap has a malformed trie size")
        self._units = array("I", blob[4 : 4 + trie_size])
        if array("I").itemsize != 4:
            raise ValueError("this platform has no 32-bit unsigned array type")
        if struct.pack("=I", 1) != struct.pack("<I", 1):
            self._units.byteswap()
        self._replacements = blob[4 + trie_size :]

    def longest_prefix(self, data: bytes, start: int) -> tuple[int, bytes] | None:
        """(length in bytes, replacement) of the longest rule matching data[start:], if any."""
        units = self._units
        unit = units[0]
        node = (unit >> 10) << ((unit & (1 << 9)) >> 6)
        best = None
        for position in range(start, len(data)):
            byte = data[position]
            node ^= byte
            if node >= len(units):
                break
            unit = units[node]
            if (unit & ((1 << 31) | 0xFF)) != byte:  # the unit's label is not this byte
                break
            node ^= (unit >> 10) << ((unit & (1 << 9)) >> 6)
            if (unit >> 8) & 1:  # has a leaf: a rule ends here
                value = units[node] & ((1 << 31) - 1)
                end = self._replacements.index(b"\0", value)
                best = (position - start + 1, self._replacements[value:end])
        return best

    def apply(self, text: str) -> list[str]:
        """`text` cut into normalised units (each a replacement or an unmatched character)."""
        data = text.encode("utf-8", errors="surrogatepass")
        units: list[str] = []
        position = 0
        while position < len(data):
            match = self.longest_prefix(data, position)
            if match is not None:
                length, replacement = match
                units.append(replacement.decode("utf-8", errors="replace"))
                position += length
                continue
            length = _utf8_length(data[position])
            chunk = data[position : position + length]
            try:
                units.append(chunk.decode("utf-8"))
            except UnicodeDecodeError:
                units.append("\ufffd")
                length = 1
            position += length
        return units


def _utf8_length(lead: int) -> int:
    if lead < 0x80:
        return 1
    if lead >= 0xF0:
        return 4
    if lead >= 0xE0:
        return 3
    return 2 if lead >= 0xC0 else 1


def normalize_with_rules(
    text: str,
    charsmap: CharsMap,
    *,
    add_dummy_prefix: bool,
    remove_extra_whitespaces: bool,
    space_marker: str,
) -> str:
    """sentencepiece's Normalizer::Normalize over compiled rules."""
    return normalize_units(
        charsmap.apply(text),
        add_dummy_prefix=add_dummy_prefix,
        remove_extra_whitespaces=remove_extra_whitespaces,
        space_marker=space_marker,
    )


def normalize_units(
    units: list[str], *, add_dummy_prefix: bool, remove_extra_whitespaces: bool, space_marker: str
) -> str:
    """sentencepiece's whitespace handling over text already cut into normalised units.

    A unit is a rule's replacement, an unmatched character, or a user-defined piece kept whole:
    leading spaces are dropped only as whole " " units, and each unit loses its leading spaces
    when the previous one ended in a space (with `remove_extra_whitespaces`)."""
    index = 0
    if remove_extra_whitespaces:
        while index < len(units) and units[index] == " ":
            index += 1
    if index == len(units):
        return ""
    out = [" "] if add_dummy_prefix else []
    is_previous_space = remove_extra_whitespaces
    for unit in units[index:]:
        if is_previous_space:
            unit = unit.lstrip(" ")
        if unit:
            out.append(unit)
            is_previous_space = unit.endswith(" ")
        if not remove_extra_whitespaces:
            is_previous_space = False
    normalized = "".join(out).replace(" ", space_marker)
    if remove_extra_whitespaces:
        normalized = normalized.rstrip(space_marker)
    return normalized
