"""Piece caches are bounded by the bytes they hold: long pieces are never kept, and past the
byte budget a cache starts over from its seed (issue 16: 3.9 MB one-letter prompts)."""

from __future__ import annotations

from ember.tokenizers import load
from ember.tokenizers.text.piece_cache import ENTRY_OVERHEAD_BYTES, PieceCache


def test_a_piece_longer_than_the_limit_is_not_cached():
    cache: PieceCache[int] = PieceCache(max_piece_chars=8)
    cache.remember("short", 1)
    cache.remember("much too long", 2)
    assert dict(cache) == {"short": 1}


def test_past_the_byte_budget_the_cache_starts_over_from_its_seed():
    seed = {"whole": 7}
    cache: PieceCache[int] = PieceCache(seed, max_bytes=3 * (ENTRY_OVERHEAD_BYTES + 4))
    for piece, value in zip("abcd", range(4), strict=True):
        cache.remember(piece, value)
    assert dict(cache) == {"whole": 7, "d": 3}
    assert cache.held_bytes == ENTRY_OVERHEAD_BYTES + 4


def test_huge_one_letter_prompts_leave_nothing_behind_in_the_caches(smollm2_gguf):
    tokenizer = load(smollm2_gguf)
    for letter in "abcde":
        ids = tokenizer.encode(letter * 300_000)
        assert tokenizer.decode(ids) == letter * 300_000
    held = tokenizer._single_cache.held_bytes + tokenizer._multi_cache.held_bytes
    assert held < 10_000
    assert all(len(piece) <= 256 for piece in [*tokenizer._single_cache, *tokenizer._multi_cache])
