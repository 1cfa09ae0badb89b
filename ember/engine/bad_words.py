"""vLLM's `bad_words`: words a request's output may not contain, as token sequences, and the bans they imply.

A word can start a line or follow a space, and most tokenizers spell the two differently, so each is
tokenized as written (leading spaces dropped) and with one leading space; the spaced spelling is kept
when it is a different token sequence of the same length (vLLM's rule). At each step a sequence's last
token is banned where the output so far ends with the sequence's other tokens: a one-token word is
never sampled, a longer one can start but not be completed. Only the output is matched, not the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from ember.tokenizers.base import Tokenizer


def bad_word_token_ids(tokenizer: Tokenizer | None, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """The token sequences `words` stand for with `tokenizer` (RequestLimits.check refuses bad words without one)."""
    if not words:
        return ()
    spellings: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spellings.append(plain)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            spellings.append(spaced)
    return tuple(spelling for spelling in spellings if spelling)


def banned_by_bad_words(bad_words: Sequence[tuple[int, ...]], output_token_ids: Sequence[int]) -> set[int]:
    """The token ids that would complete one of `bad_words` after `output_token_ids`."""
    banned = set()
    for word in bad_words:
        prefix = len(word) - 1
        if prefix > len(output_token_ids):
            continue
        if prefix == 0 or tuple(output_token_ids[-prefix:]) == word[:prefix]:
            banned.add(word[-1])
    return banned
