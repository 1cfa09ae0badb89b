"""Prompt lookup: draft what followed an earlier occurrence of the sequence's final n tokens.

Input-grounded generation (editing code, summarising with quotes) copies long runs of its
input, so the last few tokens often recur earlier in the prompt and the tokens after that
occurrence are a cheap, often right, guess. Drafting costs no model call.

Which occurrence: the one that agrees with the sequence furthest back (ties: the latest). Text
that is being copied agrees with its source for as long as the copy has run, while a short
n-gram recurs in many places (every function of a module has `result = []`; the latest one is
usually not the function being copied), so the longest agreement finds the copy in progress.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ember.engine.request import Sequence
from ember.layers.rejection_sampler import DraftRow

if TYPE_CHECKING:
    from ember.engine.runner import LastHidden


MAX_CANDIDATES = 32  # latest occurrences of the n-gram compared (bounds a lookup's cost)
MAX_AGREEMENT = 64  # tokens compared backwards from an occurrence


@dataclass
class NgramIndex:
    """For each n, the positions right after every occurrence of each n-gram of a token list (indexed incrementally)."""

    sizes: tuple[int, ...]
    num_indexed: int = 0  # n-grams ending before this position are indexed
    after: dict[int, dict[tuple[int, ...], list[int]]] = field(default_factory=dict)

    def update(self, token_ids: list[int]) -> None:
        """Index every n-gram that has at least one token after it."""
        for end in range(max(self.num_indexed, 1), len(token_ids)):
            for n in self.sizes:
                if end >= n:
                    self.after.setdefault(n, {}).setdefault(tuple(token_ids[end - n : end]), []).append(end)
        self.num_indexed = max(self.num_indexed, len(token_ids))

    def continuation(self, token_ids: list[int], num_tokens: int) -> list[int]:
        """Up to `num_tokens` that followed the best earlier occurrence of the longest matching suffix.

        Best: the occurrence whose preceding tokens agree with the sequence's furthest back; the latest on a tie.
        """
        for n in self.sizes:  # longest first
            if len(token_ids) <= n:
                continue
            ends = self.after.get(n, {}).get(tuple(token_ids[-n:]))
            if ends:
                start = max(reversed(ends[-MAX_CANDIDATES:]), key=lambda end: _agreement(token_ids, end))
                return token_ids[start : start + num_tokens]
        return []


def _agreement(token_ids: list[int], end: int) -> int:
    """How many tokens before `end` equal the sequence's last ones (up to MAX_AGREEMENT)."""
    length = len(token_ids)
    agreed = 0
    while agreed < MAX_AGREEMENT and agreed < end and token_ids[end - 1 - agreed] == token_ids[length - 1 - agreed]:
        agreed += 1
    return agreed


class NgramProposer:
    """Drafts by n-gram lookup in each sequence's own tokens (prompt and output), longest n first."""

    uses_last_hidden = False

    def __init__(self, ngram_max: int, ngram_min: int) -> None:
        self.sizes = tuple(range(ngram_max, ngram_min - 1, -1))
        self._indexes: dict[str, NgramIndex] = {}

    def propose(self, wanted: dict[Sequence, int]) -> dict[str, DraftRow]:
        drafts = {}
        for seq, num_tokens in wanted.items():
            index = self._indexes.setdefault(seq.seq_id, NgramIndex(self.sizes))
            # The index covers n-grams with a token after them; the newest token has none yet.
            index.update(seq.token_ids)
            tokens = index.continuation(seq.token_ids, num_tokens)
            if tokens:
                drafts[seq.seq_id] = DraftRow(tokens)
        return drafts

    def scored_tokens(self, seq: Sequence, num_drafts: int) -> int:
        """A chain: one scored position per drafted token."""
        return num_drafts

    def draft_token_cost_s(self) -> float | None:
        """A lookup costs next to nothing beside a forward pass: no draft cost to weigh."""
        return None

    def catch_up_cost_s(self, seq: Sequence) -> float:
        """Nothing to catch up on: the index follows the tokens for free."""
        return 0.0

    def observe(self, last_hidden: dict[str, LastHidden]) -> None:
        """Not called: the lookup reads tokens only."""

    def retain(self, seq_ids: set[str]) -> None:
        """Forget the indexes of sequences that are no longer running."""
        for seq_id in set(self._indexes) - seq_ids:
            del self._indexes[seq_id]
