"""Long pieces (one-letter runs, long words) take the compiled O(n log n) heap merge and still
match the references token for token: tiktoken for byte-level BPE, sentencepiece for Llama 2's
SentencePiece BPE (where equal scores tie-break to the leftmost pair)."""

from __future__ import annotations

import random

import pytest

from ember.tokenizers.text.patterns import NAMED_PATTERNS

RUNS = ["a" * 5000, "ab" * 3000, "日" * 2000, " " * 3000, "1" * 999, "é" * 777, "\n" * 600]


def long_words(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    parts = ["a", "b", "ab", "aa", "e", "é", "日本", "x", "🙂", "q", "ing", "the"]
    return ["".join(rng.choice(parts) for _ in range(rng.randint(150, 600))) for _ in range(count)]


def test_long_runs_and_words_match_tiktoken(shared_dir, load_shared):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    path = "tokenizers/tiktoken/cl100k_base.tiktoken"
    reference = tiktoken.Encoding(
        name="cl100k",
        pat_str=NAMED_PATTERNS["cl100k"],
        mergeable_ranks=load_tiktoken_bpe(str(shared_dir / path)),
        special_tokens={},
    )
    ours = load_shared(path)
    for text in RUNS + long_words(80, 60):
        assert ours.encode(text, allowed_special=()) == reference.encode_ordinary(text), text[:40]


def test_long_runs_and_words_match_sentencepiece(shared_dir, load_shared):
    spm = pytest.importorskip("sentencepiece")
    path = "tokenizers/llama2/tokenizer.model"
    reference = spm.SentencePieceProcessor(model_file=str(shared_dir / path))
    ours = load_shared(path)
    for text in RUNS + long_words(81, 60):
        assert ours.encode(text, allowed_special=()) == reference.encode(text), text[:40]
