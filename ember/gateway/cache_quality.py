"""How often the semantic cache answers right: its hits on labelled prompt pairs.

`ember/gateway/cache_pairs.json` holds pairs of prompts labelled `same_question` (near
duplicates, and paraphrases the cache is not expected to catch) or not (numbers, negations,
named entities, word order, operators, a long document with two questions). For each pair the
real cache stores an answer for the first prompt and looks up the second. A hit on a
different-question pair is a false hit (the bar: none); recall is the share of same-question
pairs that hit. The tests and `ember bench gateway` both read these figures from here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from ember.gateway.cache import LocalEntries, SemanticCache
from ember.gateway.config import CacheConfig

PAIRS_PATH = Path(__file__).with_name("cache_pairs.json")


@dataclasses.dataclass(frozen=True)
class LabelledPair:
    """Two prompts and whether they ask the same question (`why` says what differs)."""

    first: str
    second: str
    is_same_question: bool
    why: str


@dataclasses.dataclass(frozen=True)
class MatchQuality:
    """Hits of the cache on the labelled pairs."""

    same_pairs: int
    different_pairs: int
    true_hits: int
    false_hits: list[LabelledPair]
    missed: list[LabelledPair]

    @property
    def recall(self) -> float:
        """The share of same-question pairs the cache answered."""
        return self.true_hits / self.same_pairs

    @property
    def precision(self) -> float:
        """The share of hits that answered the same question."""
        hits = self.true_hits + len(self.false_hits)
        return self.true_hits / hits if hits else 1.0

    def summary(self) -> dict:
        """The counts and rates, as `ember bench gateway` reports them."""
        return {"same_question_pairs": self.same_pairs, "different_question_pairs": self.different_pairs,
                "true_hits": self.true_hits, "false_hits": len(self.false_hits), "precision": self.precision, "recall": self.recall}  # fmt: skip


def labelled_pairs(path: Path = PAIRS_PATH) -> list[LabelledPair]:
    """The labelled pairs of a JSON file: a list of {`a`, `b`, `same_question`, `why`} (one a line; `.json` so the
    package data carries it)."""
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [LabelledPair(row["a"], row["b"], row["same_question"], row["why"]) for row in rows]


def match_quality(pairs: list[LabelledPair]) -> MatchQuality:
    """Store an answer for each pair's first prompt (each pair in its own scope), look up the second."""

    async def hits() -> list[bool]:
        cache = SemanticCache(CacheConfig(enabled=True), LocalEntries(CacheConfig(enabled=True)))
        found = []
        for number, pair in enumerate(pairs):
            await cache.store(str(number), pair.first, {"answer": pair.first})
            found.append(await cache.lookup(str(number), pair.second) is not None)
        return found

    found = asyncio.run(hits())
    same = [pair for pair in pairs if pair.is_same_question]
    return MatchQuality(
        same_pairs=len(same),
        different_pairs=len(pairs) - len(same),
        true_hits=sum(hit for pair, hit in zip(pairs, found, strict=True) if pair.is_same_question),
        false_hits=[pair for pair, hit in zip(pairs, found, strict=True) if hit and not pair.is_same_question],
        missed=[pair for pair, hit in zip(pairs, found, strict=True) if not hit and pair.is_same_question],
    )
