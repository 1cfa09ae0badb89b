"""Byte-level BPE training with incremental pair counts, and writers for its results.

The corpus is cut into pieces by a pre-tokenizer pattern and reduced to distinct pieces with
their counts. Every distinct piece starts as its UTF-8 bytes (token ids 0..255 = byte
values). Each step merges the most frequent adjacent pair; only the pieces that contain it
are rewritten, and pair counts change by the difference (never a full recount), so a step
costs in proportion to how often its pair occurs.

Tie-breaking (documented, deterministic): among pairs with the highest count, the one whose
(left bytes, right bytes) is lexicographically smallest wins. A merge whose bytes already
exist as a token (reached earlier by another split) reuses that token.
"""

from __future__ import annotations

import base64
import heapq
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ember.tokenizers.text.byte_level import ByteLevelCodec
from ember.tokenizers.text.patterns import NAMED_PATTERNS, PreTokenizer


@dataclass
class BPETrainingResult:
    """The trained vocabulary: token bytes by id, the merges in order, and special tokens
    (ids after the ordinary tokens)."""

    tokens: list[bytes]
    merges: list[tuple[int, int]]
    pattern: str
    special_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens) + len(self.special_tokens)

    def ranks(self) -> dict[bytes, int]:
        """token bytes -> rank (= id), the content of a .tiktoken file."""
        return {token: rank for rank, token in enumerate(self.tokens)}

    def write_tiktoken(self, path: str | Path) -> None:
        """A tiktoken rank file (it cannot hold the pattern or special tokens)."""
        lines = [
            f"{base64.b64encode(token).decode()} {rank}" for rank, token in enumerate(self.tokens)
        ]
        Path(path).write_text("\n".join(lines) + "\n", encoding="ascii")

    def tokenizer_json(self) -> dict:
        """An HF tokenizer.json document (byte-level BPE, Split + ByteLevel pre-tokenizer)."""
        codec = ByteLevelCodec()
        vocab = {codec.to_text(token): rank for rank, token in enumerate(self.tokens)}
        merges = [
            f"{codec.to_text(self.tokens[left])} {codec.to_text(self.tokens[right])}"
            for left, right in self.merges
        ]
        added = [
            {
                "id": token_id,
                "content": text,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for text, token_id in self.special_tokens.items()
        ]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {
                        "type": "Split",
                        "pattern": {"Regex": self.pattern},
                        "behavior": "Isolated",
                        "invert": False,
                    },
                    {
                        "type": "ByteLevel",
                        "add_prefix_space": False,
                        "trim_offsets": False,
                        "use_regex": False,
                    },
                ],
            },
            "post_processor": None,
            "decoder": {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": False,
                "use_regex": False,
            },
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": False,
                "vocab": vocab,
                "merges": merges,
            },
        }

    def write_tokenizer_json(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps(self.tokenizer_json(), ensure_ascii=False), encoding="utf-8"
        )


def count_pieces(texts: Iterable[str], pattern: str) -> Counter[str]:
    """Distinct pre-tokenized pieces of the corpus with their counts."""
    pre_tokenizer = PreTokenizer((pattern,), is_complete=pattern in NAMED_PATTERNS.values())
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(pre_tokenizer.split(text))
    return counts


class _PairIndex:
    """Pair counts, which words hold each pair, and a lazy max-heap over the counts."""

    def __init__(self, tokens: list[bytes]) -> None:
        self.tokens = tokens
        self.counts: dict[tuple[int, int], int] = {}
        self.words_with: dict[tuple[int, int], set[int]] = {}
        self.heap: list[tuple[int, bytes, bytes, int, int]] = []

    def add(self, pair: tuple[int, int], amount: int, word_index: int | None) -> None:
        self.counts[pair] = self.counts.get(pair, 0) + amount
        if word_index is not None:
            self.words_with.setdefault(pair, set()).add(word_index)

    def push(self, pair: tuple[int, int]) -> None:
        count = self.counts.get(pair, 0)
        if count > 0:
            left, right = pair
            heapq.heappush(self.heap, (-count, self.tokens[left], self.tokens[right], left, right))

    def pop_best(self) -> tuple[int, int] | None:
        """The pair with the highest current count (ties: smallest bytes), or None."""
        while self.heap:
            negative, _, _, left, right = heapq.heappop(self.heap)
            if self.counts.get((left, right), 0) == -negative:
                return left, right
        return None


def _pairs(word: list[int]) -> list[tuple[int, int]]:
    return list(zip(word, word[1:], strict=False))


def _merge_word(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    left, right = pair
    out = []
    position = 0
    while position < len(word):
        if position + 1 < len(word) and word[position] == left and word[position + 1] == right:
            out.append(new_id)
            position += 2
        else:
            out.append(word[position])
            position += 1
    return out


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    pattern: str = NAMED_PATTERNS["cl100k"],
    special_tokens: Iterable[str] = (),
    min_frequency: int = 2,
) -> BPETrainingResult:
    """Trains a byte-level BPE vocabulary of `vocab_size` tokens (256 bytes + merges +
    special tokens). Stops early when no pair occurs `min_frequency` times."""
    specials = list(special_tokens)
    target = vocab_size - len(specials)
    if target < 256:
        raise ValueError(f"vocab_size must be at least 256 + {len(specials)} special tokens")
    piece_counts = count_pieces(texts, pattern)
    words = [list(piece.encode("utf-8")) for piece in piece_counts]
    frequencies = list(piece_counts.values())
    tokens = [bytes([byte]) for byte in range(256)]
    token_ids = {token: token_id for token_id, token in enumerate(tokens)}
    index = _PairIndex(tokens)
    for word_index, (word, frequency) in enumerate(zip(words, frequencies, strict=True)):
        for pair in _pairs(word):
            index.add(pair, frequency, word_index)
    for pair in index.counts:
        index.push(pair)
    merges: list[tuple[int, int]] = []
    while len(tokens) < target:
        pair = index.pop_best()
        if pair is None or index.counts[pair] < min_frequency:
            break
        merged = tokens[pair[0]] + tokens[pair[1]]
        new_id = token_ids.get(merged)
        if new_id is None:
            new_id = len(tokens)
            tokens.append(merged)
            token_ids[merged] = new_id
        merges.append(pair)
        changed: set[tuple[int, int]] = set()
        for word_index in index.words_with.pop(pair, ()):
            word = words[word_index]
            old_pairs = _pairs(word)
            if pair not in old_pairs:
                continue  # a stale entry: an earlier merge removed the pair from this word
            frequency = frequencies[word_index]
            new_word = _merge_word(word, pair, new_id)
            for old in old_pairs:
                index.add(old, -frequency, None)
                changed.add(old)
            for new in _pairs(new_word):
                index.add(new, frequency, word_index)
                changed.add(new)
            words[word_index] = new_word
        index.counts.pop(pair, None)
        changed.discard(pair)
        for changed_pair in changed:
            index.push(changed_pair)
    special_ids = {text: len(tokens) + offset for offset, text in enumerate(specials)}
    return BPETrainingResult(tokens, merges, pattern, special_ids)
