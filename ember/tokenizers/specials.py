"""Finding special-token text inside ordinary text, with tiktoken's allowed/disallowed rules."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import Literal

import regex

SpecialSet = Literal["all"] | Collection[str]


class SpecialTokenMatcher:
    """Splits text at occurrences of special tokens.

    At each position the longest special token that starts there wins (leftmost-longest),
    as in tiktoken and HF's added-vocabulary matcher.
    """

    def __init__(self, special_tokens: dict[str, int]) -> None:
        self.special_tokens = dict(special_tokens)
        self._patterns: dict[frozenset[str], regex.Pattern | None] = {}

    def _pattern(self, names: frozenset[str]) -> regex.Pattern | None:
        if names not in self._patterns:
            if not names:
                self._patterns[names] = None
            else:
                ordered = sorted(names, key=lambda name: (-len(name), name))
                self._patterns[names] = regex.compile("|".join(regex.escape(n) for n in ordered))
        return self._patterns[names]

    def resolve(
        self, allowed_special: SpecialSet, disallowed_special: SpecialSet
    ) -> tuple[frozenset[str], frozenset[str]]:
        """The (allowed, disallowed) name sets that "all" and explicit collections stand for."""
        every = frozenset(self.special_tokens)
        allowed = every if allowed_special == "all" else frozenset(allowed_special)
        unknown = allowed - every
        if unknown:
            raise ValueError(
                f"allowed_special names tokens this tokenizer does not have: {sorted(unknown)}"
            )
        disallowed = (
            every - allowed if disallowed_special == "all" else frozenset(disallowed_special)
        )
        return allowed, disallowed

    def check_disallowed(self, text: str, disallowed: frozenset[str]) -> None:
        """Raises ValueError when `text` contains a disallowed special token's text."""
        pattern = self._pattern(disallowed)
        if pattern is None:
            return
        match = pattern.search(text)
        if match is not None:
            raise ValueError(
                f"text contains the special token {match.group()!r}, which is disallowed; pass "
                f"allowed_special={{{match.group()!r}}} (or 'all') to encode it as a special "
                "token, or disallowed_special=() to encode it as ordinary text"
            )

    def split(self, text: str, allowed: frozenset[str]) -> Iterator[tuple[str, int | None]]:
        """Yields (chunk, None) for ordinary text and (name, id) for each allowed special."""
        pattern = self._pattern(allowed)
        if pattern is None:
            if text:
                yield text, None
            return
        position = 0
        for match in pattern.finditer(text):
            start, end = match.span()
            if start > position:
                yield text[position:start], None
            yield match.group(), self.special_tokens[match.group()]
            position = end
        if position < len(text):
            yield text[position:], None
