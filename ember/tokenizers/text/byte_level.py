"""GPT-2's reversible map between bytes and printable unicode characters.

Byte-level BPE vocabularies in `encoder.json`, `tokenizer.json` and GGUF files store each
token as text in which every byte is replaced by one printable character (a space becomes
`Ġ`, a newline `Ċ`); this module converts between that text and the real bytes.
"""

from __future__ import annotations


def bytes_to_unicode() -> dict[int, str]:
    """The byte -> character table: printable Latin-1 bytes map to themselves, the rest
    (control characters, space, a few others) to characters from U+0100 upwards, in byte order."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table: dict[int, str] = {byte: chr(byte) for byte in printable}
    next_code = 256
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(next_code)
            next_code += 1
    return dict(sorted(table.items()))


def unicode_to_bytes() -> dict[str, int]:
    """The inverse table: character -> byte."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


class ByteLevelCodec:
    """Converts token text in the byte-level alphabet to bytes and back."""

    def __init__(self) -> None:
        self._byte_to_char = bytes_to_unicode()
        self._char_to_byte = unicode_to_bytes()

    def to_bytes(self, text: str) -> bytes:
        """Bytes that `text` (in the byte-level alphabet) stands for.

        Raises ValueError when `text` has a character outside the alphabet, which means the
        token is not a byte-level token (e.g. an added token stored as plain text)."""
        try:
            return bytes(self._char_to_byte[char] for char in text)
        except KeyError as error:
            raise ValueError(f"{text!r} is not in the byte-level alphabet") from error

    def to_text(self, data: bytes) -> str:
        """The byte-level alphabet spelling of `data`."""
        return "".join(self._byte_to_char[byte] for byte in data)
