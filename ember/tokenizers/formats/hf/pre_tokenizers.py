"""HF tokenizer.json pre-tokenizers for the general pipeline (`formats/hf/pipeline.py`).

A pre-tokenizer here is a function (text, at_text_start) -> pieces. `at_text_start` says
whether the text begins the whole input (Metaspace's prepend_scheme "first" needs it).
Split behaviours follow `tokenizers`: Removed, Isolated, MergedWithPrevious, MergedWithNext,
Contiguous, optionally inverted. ByteLevel maps each piece's UTF-8 bytes to GPT-2's
printable alphabet, so the model sees the same symbols as in the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import regex

from ember.tokenizers.text.byte_level import bytes_to_unicode
from ember.tokenizers.text.normalizers import WHITE_SPACE, _pattern
from ember.tokenizers.text.patterns import GPT2_PATTERN

PreTokenize = Callable[[str, bool], list[str]]
Span = tuple[int, int]

# BERT's punctuation: ASCII punctuation plus every Unicode P* character.
PUNCTUATION = regex.compile(r"[\p{P}!-/:-@\[-`{-~]")
WHITESPACE_RUN = regex.compile("[" + regex.escape("".join(sorted(WHITE_SPACE))) + "]+")
WORDS_OR_SYMBOLS = regex.compile(r"\w+|[^\w\s]+")
DIGIT = regex.compile(r"\p{N}")


def split_by(text: str, matches: list[Span], behavior: str, invert: bool = False) -> list[str]:
    """`text` cut at `matches` with one of HF's SplitDelimiterBehavior rules.

    The text is first covered by segments, each match one segment and each gap between
    matches one; `invert` swaps which segments count as matches (adjacent segments stay
    apart, as in `tokenizers`)."""
    segments: list[tuple[str, bool]] = []  # (piece, is_match)
    position = 0
    for start, end in matches:
        if start > position:
            segments.append((text[position:start], invert))
        if end > start:
            segments.append((text[start:end], not invert))
        position = end
    if position < len(text):
        segments.append((text[position:], invert))
    if behavior == "Removed":
        return [piece for piece, is_match in segments if not is_match]
    if behavior == "Isolated":
        return [piece for piece, _ in segments]
    if behavior == "Contiguous":
        return _join_where(segments, lambda previous, current: previous == current)
    if behavior == "MergedWithPrevious":
        return _join_where(segments, lambda previous, current: current and not previous)
    if behavior == "MergedWithNext":
        return _join_where(segments, lambda previous, current: previous and not current)
    raise ValueError(f"tokenizer.json split behavior {behavior!r} is not supported")


def _join_where(segments: list[tuple[str, bool]], joins) -> list[str]:
    """Segments in order, each appended to the piece before it when joins(previous is a
    match, this is a match) holds."""
    out: list[str] = []
    previous_match: bool | None = None
    for piece, is_match in segments:
        if out and previous_match is not None and joins(previous_match, is_match):
            out[-1] += piece
        else:
            out.append(piece)
        previous_match = is_match
    return out


def _spans(pattern: regex.Pattern, text: str) -> list[Span]:
    return [match.span() for match in pattern.finditer(text)]


def _char_spans(pattern: regex.Pattern, text: str) -> list[Span]:
    """One span per matching character (HF's char-predicate splits)."""
    return [(match.start(), match.start() + 1) for match in pattern.finditer(text)]


def _split(spec: dict[str, Any]) -> PreTokenize:
    pattern = _pattern(spec["pattern"])
    behavior, invert = spec.get("behavior", "Isolated"), bool(spec.get("invert"))
    return lambda text, _: split_by(text, _spans(pattern, text), behavior, invert)


def _bert(_: dict[str, Any]) -> PreTokenize:
    def pre_tokenize(text: str, _: bool) -> list[str]:
        words = split_by(text, _spans(WHITESPACE_RUN, text), "Removed")
        return [
            piece
            for word in words
            for piece in split_by(word, _char_spans(PUNCTUATION, word), "Isolated")
        ]

    return pre_tokenize


def _metaspace(spec: dict[str, Any]) -> PreTokenize:
    replacement = spec.get("replacement", "\u2581")
    scheme = spec.get("prepend_scheme")
    if scheme is None:  # files from before prepend_scheme: add_prefix_space
        scheme = "always" if spec.get("add_prefix_space", True) else "never"
    do_split = spec.get("split", True)
    marker = regex.compile(regex.escape(replacement))

    def pre_tokenize(text: str, at_text_start: bool) -> list[str]:
        text = text.replace(" ", replacement)
        wants_prefix = scheme == "always" or (scheme == "first" and at_text_start)
        if wants_prefix and not text.startswith(replacement):
            text = replacement + text
        if not do_split:
            return [text] if text else []
        return split_by(text, _spans(marker, text), "MergedWithNext")

    return pre_tokenize


def _byte_level(spec: dict[str, Any]) -> PreTokenize:
    alphabet = bytes_to_unicode()
    add_prefix_space = spec.get("add_prefix_space", False)
    pattern = regex.compile(GPT2_PATTERN) if spec.get("use_regex", True) else None

    def pre_tokenize(text: str, _: bool) -> list[str]:
        if add_prefix_space and not text.startswith(" "):
            text = " " + text
        pieces = pattern.findall(text) if pattern is not None else [text]
        return ["".join(alphabet[byte] for byte in piece.encode()) for piece in pieces]

    return pre_tokenize


def _simple(pattern: regex.Pattern, behavior: str, per_char: bool = False) -> PreTokenize:
    find = _char_spans if per_char else _spans
    return lambda text, _: split_by(text, find(pattern, text), behavior)


def build_pre_tokenizer(spec: dict[str, Any] | None) -> PreTokenize:
    """The pre-tokenizer a tokenizer.json spec describes (None: the text is one piece)."""
    if spec is None:
        return lambda text, _: [text] if text else []
    kind = spec.get("type")
    if kind == "Sequence":
        stages = [build_pre_tokenizer(part) for part in spec["pretokenizers"]]

        def pre_tokenize(text: str, at_text_start: bool) -> list[str]:
            pieces = [text]
            for stage in stages:
                pieces = [
                    sub
                    for index, piece in enumerate(pieces)
                    for sub in stage(piece, at_text_start and index == 0)
                ]
            return pieces

        return pre_tokenize
    if kind == "Whitespace":
        return lambda text, _: WORDS_OR_SYMBOLS.findall(text)
    if kind == "WhitespaceSplit":
        return _simple(WHITESPACE_RUN, "Removed")
    if kind == "Punctuation":
        return _simple(PUNCTUATION, spec.get("behavior", "Isolated"), per_char=True)
    if kind == "Digits":
        if spec.get("individual_digits"):
            return _simple(DIGIT, "Isolated", per_char=True)
        return _simple(DIGIT, "Contiguous", per_char=True)
    builders: dict[str, Callable[[dict[str, Any]], PreTokenize]] = {
        "Split": _split,
        "BertPreTokenizer": _bert,
        "Metaspace": _metaspace,
        "ByteLevel": _byte_level,
    }
    if kind not in builders:
        raise ValueError(
            f"tokenizer.json pre_tokenizer {kind!r} is not supported by ember.tokenizers"
        )
    return builders[kind](spec)
