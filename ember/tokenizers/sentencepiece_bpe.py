"""SentencePiece-style BPE (Llama 2 family, llama2.c): scores as merge priorities.

No pre-tokenization: spaces become the marker `▁` (llama2.c vocabularies keep a real
space), a dummy space is put in front of the text, the text is cut into characters, and the
adjacent pair whose concatenation is a vocabulary piece with the highest score is merged,
leftmost on ties, until no pair merges. Characters that end up outside the vocabulary are
spelled with byte-fallback pieces `<0xNN>` (or the unknown piece when there are none).
"""

from __future__ import annotations

import heapq
import re

from ember.tokenizers.piece_cache import PieceCache
from ember.tokenizers.sentencepiece_vocab import (
    SPACE_MARKER,
    SentencePieceOptions,
    SentencePieceTokenizer,
)

__all__ = ["SPACE_MARKER", "SentencePieceBPETokenizer", "SentencePieceOptions"]


class SentencePieceBPETokenizer(SentencePieceTokenizer):
    """A scored piece vocabulary encoded by highest-score-first merges (see module doc)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # piece -> (negated score, id): the heap orders by it, so the best score pops first.
        self._mergeable: dict[str, tuple[float, int]] = {}
        merge_kinds = self.options.merge_kinds
        for token_id, (piece, score, kind) in enumerate(
            zip(self._pieces, self._scores, self._kinds, strict=True)
        ):
            if kind in merge_kinds and piece not in self._mergeable:
                self._mergeable[piece] = (-score, token_id)
        self._word_split = self._word_splitter()
        self._word_cache: PieceCache[list[int]] = PieceCache()

    def _word_splitter(self) -> re.Pattern | None:
        """A splitter of normalised text into words that merges never cross, or None.

        When no mergeable piece has the space marker after its first character (runs of
        markers aside) and the marker itself is a piece, no merge can join a non-marker
        character to a following marker: cutting before every marker that follows another
        character gives pieces that merge independently. Then each word's ids are cached.
        """
        marker = self.options.space_marker
        if marker not in self._mergeable:
            return None
        for piece in self._mergeable:
            if marker in piece[1:] and piece.strip(marker):
                return None
        escaped = re.escape(marker)
        return re.compile(f"(?<=[^{escaped}])(?={escaped})")

    def _segment(self, normalized: str) -> list[int]:
        if self._word_split is None:
            return self._segment_uncached(normalized)
        cache = self._word_cache
        ids: list[int] = []
        for word in self._word_split.split(normalized):
            word_ids = cache.get(word)
            if word_ids is None:
                word_ids = self._segment_uncached(word)
                cache.remember(word, word_ids)
            ids.extend(word_ids)
        return ids

    def _segment_uncached(self, normalized: str) -> list[int]:
        ids: list[int] = []
        mergeable = self._mergeable
        unknown_run: list[str] = []  # consecutive unknown symbols become one unknown token
        for symbol in self._merge(list(normalized)):
            entry = mergeable.get(symbol)
            if entry is None:
                unknown_run.append(symbol)
                continue
            if unknown_run:
                ids.extend(self._spell_unknown("".join(unknown_run)))
                unknown_run = []
            ids.append(entry[1])
        if unknown_run:
            ids.extend(self._spell_unknown("".join(unknown_run)))
        return ids

    def _merge(self, symbols: list[str]) -> list[str]:
        # Heap of (negated score, left position); linked list over positions. An entry is
        # stale when its left symbol died or changed, or the right neighbour changed.
        mergeable = self._mergeable
        count = len(symbols)
        next_at = list(range(1, count + 1))
        prev_at = list(range(-1, count - 1))
        alive = [True] * count
        heap: list[tuple[float, int, str]] = []

        def push(left: int, right: int) -> None:
            merged = symbols[left] + symbols[right]
            entry = mergeable.get(merged)
            if entry is not None:
                heap.append((entry[0], left, merged))

        for at in range(count - 1):
            push(at, at + 1)
        heapq.heapify(heap)
        while heap:
            _, at, merged = heapq.heappop(heap)
            if not alive[at]:
                continue
            right = next_at[at]
            if right >= count or symbols[at] + symbols[right] != merged:
                continue
            symbols[at] = merged
            alive[right] = False
            after = next_at[right]
            next_at[at] = after
            if after < count:
                prev_at[after] = at
                entry = mergeable.get(merged + symbols[after])
                if entry is not None:
                    heapq.heappush(heap, (entry[0], at, merged + symbols[after]))
            before = prev_at[at]
            if before >= 0:
                entry = mergeable.get(symbols[before] + merged)
                if entry is not None:
                    heapq.heappush(heap, (entry[0], before, symbols[before] + merged))
        return [symbol for symbol, keep in zip(symbols, alive, strict=False) if keep]

    def __repr__(self) -> str:
        return f"SentencePieceBPETokenizer(name={self.name!r}, vocab_size={self.vocab_size})"
