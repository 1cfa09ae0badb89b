"""Finding special-token text inside ordinary text, with tiktoken's allowed/disallowed rules."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Literal

import regex

SpecialSet = Literal["all"] | Collection[str]


class SpecialTokenMatcher:
    """Splits text at occurrences of special tokens.

    At each position the longest special token that starts there wins (leftmost-longest),
    as in tiktoken and HF's added-vocabulary matcher. With `longest_first`, llama.cpp's
    order instead: the longest token is cut out of the whole text first, then the next
    longest out of what is left, and so on (tokens of one length: leftmost first, where
    llama.cpp's order is unspecified). The two differ only where tokens overlap in the text.
    Tokens named in `strip_left` / `strip_right` (HF's `lstrip` / `rstrip`) also absorb the
    whitespace beside them.

    `always_matched` are added tokens that are ordinary vocabulary rather than special (HF
    `special: false`, GGUF and sentencepiece user-defined): `tokenizers`, llama.cpp and
    sentencepiece match them in every text, so `allowed_special` / `disallowed_special`
    do not govern them.
    """

    def __init__(
        self,
        special_tokens: dict[str, int],
        strip_left: frozenset[str] = frozenset(),
        strip_right: frozenset[str] = frozenset(),
        always_matched: frozenset[str] = frozenset(),
        longest_first: bool = False,
    ) -> None:
        self.special_tokens = dict(special_tokens)
        self._every = frozenset(self.special_tokens)  # one object: its hash is computed once
        self._always = frozenset(always_matched) & self._every
        self._strip_left = strip_left
        self._strip_right = strip_right
        self._longest_first = longest_first
        self._patterns: dict[frozenset[str], tuple[regex.Pattern, list[str]] | None] = {}
        self._passes: dict[frozenset[str], list[tuple[regex.Pattern, list[str]]]] = {}

    def _pattern(self, names: frozenset[str]) -> tuple[regex.Pattern, list[str]] | None:
        """The alternation over `names` (longest first) and the name of each group."""
        if names not in self._patterns:
            if not names:
                self._patterns[names] = None
            else:
                ordered = sorted(names, key=lambda name: (-len(name), name))
                alternatives = "|".join(f"({self._stripped(name)})" for name in ordered)
                self._patterns[names] = (regex.compile(alternatives), ordered)
        return self._patterns[names]

    def resolve(
        self, allowed_special: SpecialSet, disallowed_special: SpecialSet
    ) -> tuple[frozenset[str], frozenset[str]]:
        """The (allowed, disallowed) name sets that "all" and explicit collections stand for."""
        every = self._every
        allowed = every if allowed_special == "all" else frozenset(allowed_special)
        unknown = allowed - every
        if unknown:
            raise ValueError(
                f"allowed_special names tokens this tokenizer does not have: {sorted(unknown)}"
            )
        if self._always:
            allowed = allowed | self._always
        disallowed = (
            every - allowed if disallowed_special == "all" else frozenset(disallowed_special)
        )
        return allowed, disallowed

    def check_disallowed(self, text: str, disallowed: frozenset[str]) -> None:
        """Raises ValueError when `text` contains a disallowed special token's text."""
        compiled = self._pattern(disallowed)
        if compiled is None:
            return
        match = compiled[0].search(text)
        if match is not None:
            name = compiled[1][match.lastindex - 1]
            raise ValueError(
                f"text contains the special token {name!r}, which is disallowed; pass "
                f"allowed_special={{{name!r}}} (or 'all') to encode it as a special "
                "token, or disallowed_special=() to encode it as ordinary text"
            )

    def encode(self, text: str, allowed_special: SpecialSet, disallowed_special: SpecialSet,
               encode_ordinary: Callable[[str], list[int]]) -> list[int]:
        """Ids of `text`: allowed special-token text as its id, every other chunk through `encode_ordinary`.

        Raises ValueError (naming the fix) when `text` holds a disallowed special token's text."""
        allowed, disallowed = self.resolve(allowed_special, disallowed_special)
        self.check_disallowed(text, disallowed)
        ids: list[int] = []
        for chunk, special_id in self.split(text, allowed):
            if special_id is None:
                ids.extend(encode_ordinary(chunk))
            else:
                ids.append(special_id)
        return ids

    def split(self, text: str, allowed: frozenset[str]) -> Iterator[tuple[str, int | None]]:
        """Yields (chunk, None) for ordinary text and (name, id) for each allowed special."""
        compiled = self._pattern(allowed)
        if compiled is None or (self._longest_first and compiled[0].search(text) is None):
            if text:
                yield text, None
            return
        if self._longest_first:
            yield from self._split_longest_first(text, allowed)
            return
        pattern, names = compiled
        position = 0
        for match in pattern.finditer(text):
            start, end = match.span()
            if start > position:
                yield text[position:start], None
            name = names[match.lastindex - 1]
            yield name, self.special_tokens[name]
            position = end
        if position < len(text):
            yield text[position:], None

    def _length_passes(self, names: frozenset[str]) -> list[tuple[regex.Pattern, list[str]]]:
        """One alternation per token length, longest first (see `longest_first`)."""
        if names not in self._passes:
            by_length: dict[int, list[str]] = {}
            for name in sorted(names):
                by_length.setdefault(len(name), []).append(name)
            self._passes[names] = [
                (regex.compile("|".join(f"({self._stripped(n)})" for n in group)), group)
                for _, group in sorted(by_length.items(), reverse=True)
            ]
        return self._passes[names]

    def _stripped(self, name: str) -> str:
        left = r"\s*" if name in self._strip_left else ""
        right = r"\s*" if name in self._strip_right else ""
        return f"{left}{regex.escape(name)}{right}"

    def _split_longest_first(
        self, text: str, allowed: frozenset[str]
    ) -> Iterator[tuple[str, int | None]]:
        chunks: list[tuple[str, int | None]] = [(text, None)]
        for pattern, names in self._length_passes(allowed):
            cut: list[tuple[str, int | None]] = []
            for chunk, token_id in chunks:
                if token_id is not None:
                    cut.append((chunk, token_id))
                    continue
                position = 0
                for match in pattern.finditer(chunk):
                    start, end = match.span()
                    if start > position:
                        cut.append((chunk[position:start], None))
                    name = names[match.lastindex - 1]
                    cut.append((name, self.special_tokens[name]))
                    position = end
                if position < len(chunk):
                    cut.append((chunk[position:], None))
            chunks = cut
        yield from chunks
