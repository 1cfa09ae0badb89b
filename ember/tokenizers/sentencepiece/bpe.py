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

from ember.tokenizers.bpe.merges import MAX_VOCAB, BytePairMerger, pair_key, pair_value
from ember.tokenizers.sentencepiece.vocab import (
    SPACE_MARKER,
    SentencePieceOptions,
    SentencePieceTokenizer,
)
from ember.tokenizers.text.piece_cache import PieceCache

__all__ = ["SPACE_MARKER", "SentencePieceBPETokenizer", "SentencePieceOptions"]

# Words longer than this (characters) take the compiled heap merge when it is available.
LONG_WORD = 256


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
        self._pair_merger: BytePairMerger | None = None  # built on the first long word
        self._orphan_chars: frozenset[str] = frozenset()

    def _long_word_merger(self) -> BytePairMerger | None:
        """The merges as a pair table over piece ids for the compiled heap merge (O(n log n)
        in C, for words of thousands of characters such as a 4 MB run of one letter): the
        pair (a, b) merges into piece a+b, priority = rank of its score, equal scores sharing
        a rank so that ties go to the leftmost pair as in sentencepiece. None without a
        compiled core."""
        if self._pair_merger is None:
            ranks = {
                score: rank
                for rank, score in enumerate(sorted({s for s, _ in self._mergeable.values()}))
            }
            table: dict[int, int] = {}
            for piece, (score, token_id) in self._mergeable.items():
                for cut in range(1, len(piece)):
                    left, right = self._mergeable.get(piece[:cut]), self._mergeable.get(piece[cut:])
                    if left is not None and right is not None:
                        table[pair_key(left[1], right[1])] = pair_value(ranks[score], token_id)
            self._pair_merger = BytePairMerger([None] * 256, table)
            # Characters inside pieces that are no piece themselves: a word holding one is
            # merged by the string loop, where such a character can still join a piece.
            chars = {char for piece in self._mergeable for char in piece}
            self._orphan_chars = frozenset(char for char in chars if char not in self._mergeable)
        return self._pair_merger if self._pair_merger.is_native else None

    def _segment_long_word(self, word: str) -> list[int] | None:
        merger = self._long_word_merger()
        if merger is None or not self._orphan_chars.isdisjoint(word):
            return None
        mergeable = self._mergeable
        unknown_base = max(self.vocab_size, len(self._pieces))
        unknown: dict[str, int] = {}
        symbols = []
        for char in word:
            entry = mergeable.get(char)
            if entry is None:
                entry = (0.0, unknown.setdefault(char, unknown_base + len(unknown)))
            symbols.append(entry[1])
        if unknown_base + len(unknown) >= MAX_VOCAB:
            return None
        merged = merger._native.merge_ids(symbols) if merger._native is not None else None
        if merged is None:
            return None
        by_id = {token_id: char for char, token_id in unknown.items()}
        ids: list[int] = []
        unknown_run: list[str] = []
        for token_id in merged:
            if token_id >= unknown_base:
                unknown_run.append(by_id[token_id])
                continue
            if unknown_run:
                ids.extend(self._spell_unknown("".join(unknown_run)))
                unknown_run = []
            ids.append(token_id)
        if unknown_run:
            ids.extend(self._spell_unknown("".join(unknown_run)))
        return ids

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
        if len(normalized) > LONG_WORD:
            ids = self._segment_long_word(normalized)
            if ids is not None:
                return ids
        ids = []
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
