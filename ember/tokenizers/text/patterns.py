"""Pre-tokenization: the regular expressions that cut text into pieces before BPE merges.

Each named pattern is a fact about one published tokenizer (GPT-2/r50k/p50k, cl100k,
o200k, Llama 3, Qwen2); SmolLM2 first isolates every digit and then applies GPT-2's
pattern to what lies between. Pieces never cross the boundaries the pattern finds, so
merges stay inside a piece, and the piece is the unit of the encoder's cache.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate, chain, islice

import regex

Splitter = Callable[[str], list[str]]

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# tiktoken's r50k/p50k spelling of the GPT-2 pattern (possessive, same matches).
R50K_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# One piece per numeric character: HF's `Digits(individual_digits=True)`.
SINGLE_DIGIT_PATTERN = r"\p{N}"
# SmolLM2: digits isolated, then GPT-2's pattern between them, as one pattern. Splitting at
# digits first ends a whitespace run before a digit where the chunk ends, where GPT-2's
# `\s+(?!\S)` takes the whole run: `\s+(?=\p{N})`, tried first, does the same here.
SMOLLM_PATTERN = (
    r"""\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?=\p{N})|\s+(?!\S)|\s+"""
)

# Qwen3.5: letters carry their combining marks (\p{M}), so "e" + U+0301 stays one piece.
QWEN35_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Mistral's Tekken: o200k's case-aware words without the contractions, single digits.
TEKKEN_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*""",
        r"""\p{N}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# Ling/Bailing MoE: Llama 3's shape with single digits and possessive quantifiers.
BAILING_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
# Seed-Coder: single digits, punctuation runs never take a newline.
SEED_CODER_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

NAMED_PATTERNS: dict[str, str] = {
    "gpt2": GPT2_PATTERN,
    "r50k": R50K_PATTERN,
    "p50k": R50K_PATTERN,
    "cl100k": CL100K_PATTERN,
    "o200k": O200K_PATTERN,
    "llama3": LLAMA3_PATTERN,
    "qwen2": QWEN2_PATTERN,
    "smollm": SMOLLM_PATTERN,
    "qwen35": QWEN35_PATTERN,
    "tekken": TEKKEN_PATTERN,
    "bailing": BAILING_PATTERN,
    "seed-coder": SEED_CODER_PATTERN,
}


@dataclass(frozen=True)
class PreTokenizer:
    """Cuts text into pieces with a sequence of splitting stages.

    Each stage is a regex whose matches become pieces and whose unmatched gaps are kept as
    pieces too (HF's "Isolated" split behaviour), applied to every piece of the previous
    stage. Most tokenizers have one stage; SmolLM2 has two (digits, then GPT-2).
    """

    stages: tuple[str, ...]
    # True when every stage matches every character of any text (all named patterns do),
    # so `findall` alone gives the pieces: the fast path.
    is_complete: bool = False
    _compiled: tuple[regex.Pattern, ...] = field(init=False, repr=False, compare=False)
    _ascii_compiled: tuple[re.Pattern, ...] | None = field(init=False, repr=False, compare=False)
    _splitters: tuple[Splitter, ...] = field(init=False, repr=False, compare=False)
    _ascii_splitters: tuple[Splitter, ...] | None = field(init=False, repr=False, compare=False)
    _is_local: tuple[bool, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.is_complete and len(self.stages) != 1:
            raise ValueError("is_complete applies to a single-stage pre-tokenizer only")
        compiled = tuple(map(compile_stage, self.stages))
        # Stages `re` already runs need no ASCII variant.
        is_all_re = all(isinstance(pattern, re.Pattern) for pattern in compiled)
        ascii_compiled = None if is_all_re else ascii_variants(self.stages)
        object.__setattr__(self, "_compiled", compiled)
        object.__setattr__(self, "_ascii_compiled", ascii_compiled)
        object.__setattr__(self, "_splitters", tuple(map(isolating_splitter, compiled)))
        object.__setattr__(self, "_is_local", tuple(map(matches_locally, compiled)))
        object.__setattr__(
            self,
            "_ascii_splitters",
            None if ascii_compiled is None else tuple(map(isolating_splitter, ascii_compiled)),
        )

    @classmethod
    def named(cls, name: str) -> PreTokenizer:
        """The pre-tokenizer of a known tokenizer family (see NAMED_PATTERNS)."""
        if name not in NAMED_PATTERNS:
            known = ", ".join(sorted(NAMED_PATTERNS))
            raise ValueError(f"unknown pre-tokenizer {name!r}; known: {known}")
        return cls((NAMED_PATTERNS[name],), is_complete=True)

    @classmethod
    def from_stages(cls, stages: tuple[str, ...] | list[str]) -> PreTokenizer:
        """The pre-tokenizer that applies `stages` in turn (HF's Split "Isolated" sequence,
        llama.cpp's regex list); no stage at all keeps the text whole."""
        stages = tuple(stages)
        if not stages:
            return cls((r"(?s).+",), is_complete=True)
        if stages == (SINGLE_DIGIT_PATTERN, GPT2_PATTERN):  # Digits + ByteLevel, as one pattern
            return cls.named("smollm")
        # A single stage that is one of the published patterns covers every character.
        is_complete = len(stages) == 1 and stages[0] in NAMED_PATTERNS.values()
        return cls(stages, is_complete=is_complete)

    def split(self, text: str) -> list[str]:
        """The pieces of `text`, in order; their concatenation is `text`."""
        compiled, splitters = self._compiled, self._splitters
        if self._ascii_compiled is not None and text.isascii():
            compiled, splitters = self._ascii_compiled, self._ascii_splitters
        if self.is_complete:
            return compiled[0].findall(text)
        # Each splitter may leave empty strings; map, chain and filter keep the loop in C.
        pieces = list(filter(None, splitters[0](text)))
        for pattern, splitter, is_local in zip(
            compiled[1:], splitters[1:], self._is_local[1:], strict=True
        ):
            if is_local:
                pieces = _split_where_matched(pattern, splitter, text, pieces)
            else:
                pieces = list(filter(None, chain.from_iterable(map(splitter, pieces))))
        return pieces


# Syntax outside what `re` and `regex` read alike: class escapes (\\p, \\s, \\w, ...),
# anchors and backreferences as escapes, inline flags, named groups, nested or POSIX classes.
_NOT_SHARED_SYNTAX = regex.compile(r"\\[^uUxrntfv\W]|\(\?[^:=!<>]|\(\?<[^=!]|\[\[|\[:")


def compile_stage(stage: str) -> regex.Pattern | re.Pattern:
    """`stage` compiled with the standard `re` when it uses only syntax both engines read
    alike (then `re`, about 3x faster, cuts the same pieces: e.g. a pattern whose classes are
    written out as code point ranges), else with `regex`."""
    if _NOT_SHARED_SYNTAX.search(stage) is None:
        try:
            return re.compile(stage)
        except re.error:
            pass
    return regex.compile(stage)


def _split_where_matched(
    pattern: regex.Pattern | re.Pattern, splitter: Splitter, text: str, pieces: list[str]
) -> list[str]:
    """A context-free stage applied only to the pieces it can cut.

    For a pattern that looks at no context (see `matches_locally`), a match inside a piece is
    a match in the text there, so a piece that no match of the whole text overlaps has none of
    its own: only the pieces overlapping the text's matches are split (found by bisecting
    piece end offsets); when matches are dense, every piece is split as usual."""
    spans = [match.span() for match in islice(pattern.finditer(text), len(pieces) // 4 + 1)]
    if not spans:
        return pieces
    if len(spans) > len(pieces) // 4:
        return list(filter(None, chain.from_iterable(map(splitter, pieces))))
    ends = list(accumulate(map(len, pieces)))
    touched = sorted(
        {
            index
            for start, end in spans
            for index in range(bisect_right(ends, start), bisect_right(ends, end - 1) + 1)
        }
    )
    out: list[str] = []
    previous = 0
    for index in touched:
        out += pieces[previous:index]
        out += filter(None, splitter(pieces[index]))
        previous = index + 1
    out += pieces[previous:]
    return out


def ascii_variants(stages: tuple[str, ...]) -> tuple[re.Pattern, ...] | None:
    """The stages rewritten for text that is all ASCII, compiled with the standard library's
    `re` (about 3x faster than `regex` on such text): every Unicode class (\\p{L}, \\s, ...) is
    replaced by its ASCII members, which matches exactly the same on ASCII input. None when a
    stage uses syntax this rewriting does not know (then `regex` is always used)."""
    classes = _ascii_classes()
    variants = []
    for stage in stages:
        if "(?V1" in stage:
            return None  # set operations: the standard `re` would misread them
        rewritten = _rewrite_classes(stage, classes)
        if rewritten is None:
            return None
        try:
            variants.append(re.compile(rewritten))
        except re.error:
            return None
    return tuple(variants)


_ASCII_PROPERTIES = (
    r"\p{L}",
    r"\p{N}",
    r"\P{N}",
    r"\p{Lu}",
    r"\p{Ll}",
    r"\p{Lt}",
    r"\p{Lm}",
    r"\p{Lo}",
    r"\p{M}",
    r"\p{P}",
    r"\s",
    r"\S",
)


def _ascii_classes() -> dict[str, str]:
    """Class escape -> the ASCII characters it matches, as the inside of a [...] class."""
    ascii_text = "".join(chr(code) for code in range(128))
    classes = {}
    for escape in _ASCII_PROPERTIES:
        members = regex.findall(escape, ascii_text)
        classes[escape] = "".join(f"\\x{ord(char):02x}" for char in members)
    return classes


def _rewrite_classes(pattern: str, classes: dict[str, str]) -> str | None:
    out = []
    position = 0
    in_class = False
    while position < len(pattern):
        char = pattern[position]
        if char == "\\":
            token = pattern[position : position + 2]
            if token in ("\\p", "\\P"):
                close = pattern.find("}", position)
                token = pattern[position : close + 1]
            if token in classes:
                members = classes[token]
                if in_class:
                    out.append(members)
                else:  # "[]" is not valid syntax; "(?!)" is the class that never matches
                    out.append(f"[{members}]" if members else "(?!)")
            elif token[1] in "pPsSwWdDbB":
                return None  # a class this rewriting does not know
            else:
                out.append(token)
            position += len(token)
            continue
        if char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        out.append(char)
        position += 1
    return "".join(out)


def isolating_splitter(pattern: regex.Pattern | re.Pattern) -> Splitter:
    """A function text -> matches of `pattern` plus the gaps between them, in order, with
    empty strings among them (the caller drops those).

    `split` on the pattern wrapped in one group returns gaps and matches alternately (empty
    strings where a match is empty or two touch), all in C. The pattern's own groups are
    made non-capturing first (they would add items); with backreferences, finditer is used."""
    source = pattern.pattern
    if pattern.groups:
        source = _non_capturing(source)
        if source is None:
            return partial(_split_isolated, pattern)
    compile_pattern = re.compile if isinstance(pattern, re.Pattern) else regex.compile
    flags = GLOBAL_FLAGS.match(source)  # inline global flags must stay in front
    head, body = (flags.group(), source[flags.end() :]) if flags else ("", source)
    return compile_pattern(f"{head}({body})", pattern.flags).split


GLOBAL_FLAGS = regex.compile(r"\(\?[A-Za-z0-9]+\)")
CONTEXT_SYNTAX = regex.compile(r"\(\?<?[=!]|\\[bBAZzG]|(?<!\\)[$^]")


def for_oniguruma(pattern: str) -> str:
    """`pattern` as `tokenizers` (Oniguruma, Ruby syntax) reads it: there `^` and `$` match at
    every line start and end, which Python's `regex` does under MULTILINE. Unchanged when
    it has no such anchor outside a character class (so published patterns stay recognised)."""
    in_class, position = False, 0
    while position < len(pattern):
        char = pattern[position]
        if char == "\\":
            position += 2
            continue
        if char == "[" and not in_class:
            in_class = True
            if pattern.startswith("[^", position):
                position += 1  # a negation, not an anchor
        elif char == "]" and in_class:
            in_class = False
        elif char in "^$" and not in_class:
            return "(?m)" + pattern
        position += 1
    return pattern


def matches_locally(pattern: regex.Pattern) -> bool:
    """Whether a match of `pattern` inside a piece of a text is a match in the text too:
    true when it looks at no context (no lookaround, anchor or word boundary) and never
    matches empty. Then a text with no match has no piece with one, and the stage is skipped."""
    return CONTEXT_SYNTAX.search(pattern.pattern) is None and pattern.fullmatch("") is None


def _non_capturing(source: str) -> str | None:
    """`source` with every capturing group made non-capturing; None if it has
    backreferences or named groups (which need their captures)."""
    if regex.search(r"\\[1-9]|\(\?P?<[A-Za-z]|\(\?P=", source):
        return None
    out = []
    position, in_class = 0, False
    while position < len(source):
        char = source[position]
        if char == "\\":
            out.append(source[position : position + 2])
            position += 2
            continue
        if char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        elif char == "(" and not in_class and not source.startswith("(?", position):
            out.append("(?:")
            position += 1
            continue
        out.append(char)
        position += 1
    return "".join(out)


def _split_isolated(pattern: regex.Pattern, text: str) -> list[str]:
    """Matches of `pattern` in `text` plus the gaps between them, in order."""
    pieces: list[str] = []
    position = 0
    for match in pattern.finditer(text):
        start, end = match.span()
        if start > position:
            pieces.append(text[position:start])
        if end > start:
            pieces.append(text[start:end])
        position = end
    if position < len(text):
        pieces.append(text[position:])
    return pieces
