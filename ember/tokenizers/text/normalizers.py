"""HF tokenizer.json normalizers as functions str -> str.

Each is a fact about the `tokenizers` library: NFC/NFD/NFKC/NFKD, Lowercase, StripAccents
(drops every combining mark; BERT's own stripping drops only Mn), Replace (a literal or regex, every occurrence), Prepend (only
to non-empty text), Strip, BertNormalizer (clean text, pad CJK ideographs, strip accents,
lowercase, in that order), Precompiled (sentencepiece's charsmap) and Sequence.
"""

from __future__ import annotations

import base64
import unicodedata
from collections.abc import Callable
from typing import Any

import regex

from ember.tokenizers.text.patterns import for_oniguruma
from ember.tokenizers.text.sentencepiece_normalizer import CharsMap

Normalizer = Callable[[str], str]

# Rust's char::is_whitespace (the Unicode White_Space property); Python's str.isspace also
# counts U+001C..U+001F, which Rust (and so `tokenizers`) treat as control characters.
WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# The CJK ideograph blocks BERT pads with spaces (as `tokenizers` lists them).
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def is_white_space(char: str) -> bool:
    return char in WHITE_SPACE


CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs"})


def is_control(char: str) -> bool:
    """BERT's control test as `tokenizers` has it: Cc, Cf, Co or Cs, except tab, newline and
    carriage return. Unassigned code points (Cn) are kept, so they become [UNK]."""
    return char not in "\t\n\r" and unicodedata.category(char) in CONTROL_CATEGORIES


def is_cjk(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in CJK_RANGES)


def strip_nonspacing_marks(text: str) -> str:
    """BERT's accent stripping: drops Mn characters only."""
    return "".join(char for char in text if unicodedata.category(char) != "Mn")


def strip_marks(text: str) -> str:
    """The StripAccents normalizer: drops every combining mark (Mn, Mc, Me)."""
    return "".join(char for char in text if unicodedata.category(char)[0] != "M")


def bert_normalizer(spec: dict[str, Any]) -> Normalizer:
    clean = spec.get("clean_text", True)
    pad_cjk = spec.get("handle_chinese_chars", True)
    lowercase = spec.get("lowercase", True)
    accents = spec.get("strip_accents")
    strip = lowercase if accents is None else accents

    def normalize(text: str) -> str:
        if clean:
            text = "".join(
                " " if is_white_space(char) else char
                for char in text
                if char not in "\x00\ufffd" and not is_control(char)
            )
        if pad_cjk:
            text = "".join(f" {char} " if is_cjk(char) else char for char in text)
        if strip:
            text = strip_nonspacing_marks(unicodedata.normalize("NFD", text))
        return text.lower() if lowercase else text

    return normalize


def _pattern(spec: dict[str, Any]) -> regex.Pattern:
    """A Replace/Split pattern: {"String": literal} or {"Regex": expression, read as
    Oniguruma does: `^`/`$` at line boundaries}."""
    if "Regex" in spec:
        return regex.compile(for_oniguruma(spec["Regex"]))
    return regex.compile(regex.escape(spec["String"]))


def _replace(spec: dict[str, Any]) -> Normalizer:
    pattern, content = _pattern(spec["pattern"]), spec["content"]
    return lambda text: pattern.sub(lambda _: content, text)


def _prepend(spec: dict[str, Any]) -> Normalizer:
    prefix = spec["prepend"]
    return lambda text: prefix + text if text else text


def _strip(spec: dict[str, Any]) -> Normalizer:
    left, right = spec.get("strip_left", True), spec.get("strip_right", True)

    def normalize(text: str) -> str:
        start, end = 0, len(text)
        while left and start < end and is_white_space(text[start]):
            start += 1
        while right and end > start and is_white_space(text[end - 1]):
            end -= 1
        return text[start:end]

    return normalize


def _precompiled(spec: dict[str, Any]) -> Normalizer:
    charsmap = CharsMap(base64.b64decode(spec["precompiled_charsmap"]))
    return lambda text: "".join(charsmap.apply(text))


def _unicode_form(form: str) -> Normalizer:
    return lambda text: unicodedata.normalize(form, text)


def build_normalizer(spec: dict[str, Any] | None) -> Normalizer | None:
    """The normalizer a tokenizer.json spec describes; None for no normalizer.

    Raises ValueError naming the part for a normalizer type this module does not know."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return _unicode_form(kind)
    if kind == "Sequence":
        parts = [build_normalizer(part) for part in spec["normalizers"]]
        steps = [part for part in parts if part is not None]

        def normalize(text: str) -> str:
            for step in steps:
                text = step(text)
            return text

        return normalize
    builders: dict[str, Callable[[dict[str, Any]], Normalizer]] = {
        "Lowercase": lambda _: str.lower,
        "StripAccents": lambda _: strip_marks,
        "BertNormalizer": bert_normalizer,
        "Replace": _replace,
        "Prepend": _prepend,
        "Strip": _strip,
        "Precompiled": _precompiled,
    }
    if kind not in builders:
        raise ValueError(f"tokenizer.json normalizer {kind!r} is not supported by ember.tokenizers")
    return builders[kind](spec)
