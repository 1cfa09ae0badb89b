"""The most prompt lookup could buy on a text the target has already produced: an oracle's tokens per step.

An n-gram proposer drafts what followed an earlier occurrence of the sequence's newest tokens (in
its prompt or its output so far). Knowing the target's greedy output, an oracle can pick at every
decode step the earlier occurrence of the newest token whose continuation the target keeps
longest, and draft it `depth` deep. Each step then yields the kept drafts plus the target's own
token. Any proposer of that family (it must match at least the newest token, and can only copy
what the sequence already holds) keeps no more per step, and a verification costs at least a
decode step, so the oracle's tokens per step bound the proposer's decode speed-up at that depth:
when the bound is below a goal, no choice of occurrence, n-gram size or tree can meet it on that
text with that model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LookupCeiling:
    """Decode tokens and oracle verification steps over one or more outputs (tokens after each first)."""

    tokens: int
    steps: int

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 1.0

    def __add__(self, other: LookupCeiling) -> LookupCeiling:
        return LookupCeiling(self.tokens + other.tokens, self.steps + other.steps)


def lookup_ceiling(prompt: Sequence[int], output: Sequence[int], depth: int) -> LookupCeiling:
    """The oracle's steps over `output`'s decode tokens (the first comes from the prefill), drafting `depth` deep."""
    if depth < 1:
        raise ValueError("the draft depth must be at least 1")
    text = [*prompt, *output]
    after: dict[int, list[int]] = {}  # token -> positions right after its occurrences, in the part the sequence holds
    indexed = 1
    position = len(prompt) + 1  # the next token to produce; the one before it is the prefill's
    steps = 0
    while position < len(text):
        for end in range(indexed, position):
            after.setdefault(text[end - 1], []).append(end)
        indexed = position
        kept = max((_kept(text, start, position, depth) for start in after.get(text[position - 1], ())), default=0)
        position += kept + 1
        steps += 1
    return LookupCeiling(max(0, len(output) - 1), steps)


def _kept(text: list[int], start: int, position: int, depth: int) -> int:
    """How many tokens copied from `start` (inside the held part, before `position`) the target produces next."""
    kept = 0
    while kept < depth and start + kept < position and position + kept < len(text) and text[start + kept] == text[position + kept]:
        kept += 1
    return kept


def overall_ceiling(decode_ceiling: float, decode_share: float) -> float:
    """The bound on a whole request's speed-up when only its decode share of the time (0..1) speeds up."""
    return 1.0 / ((1.0 - decode_share) + decode_share / decode_ceiling)
