"""BPE training: same merges as a naive recount-every-step trainer, documented tie-breaking,
and outputs that tiktoken and `tokenizers` read and encode exactly as ember does."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
from tok_corpus import build_corpus

from ember.tokenizers import load
from ember.tokenizers.formats.tiktoken_files import load_tiktoken
from ember.tokenizers.text.patterns import NAMED_PATTERNS
from ember.tokenizers.training.bpe import count_pieces, train_bpe

PATTERN = NAMED_PATTERNS["cl100k"]


def naive_train(texts, vocab_size):
    """The textbook trainer: recount every pair before every merge (the oracle)."""
    words = {piece: count for piece, count in count_pieces(texts, PATTERN).items()}
    split = {piece: [bytes([b]) for b in piece.encode()] for piece in words}
    tokens = [bytes([b]) for b in range(256)]
    merges = []
    while len(tokens) < vocab_size:
        pairs = Counter()
        for piece, parts in split.items():
            for pair in zip(parts, parts[1:], strict=False):
                pairs[pair] += words[piece]
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair[0], pair[1]))
        if pairs[best] < 2:
            break
        merged = best[0] + best[1]
        if merged not in tokens:
            tokens.append(merged)
        merges.append(best)
        for piece, parts in split.items():
            out, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            split[piece] = out
    return tokens, merges


@pytest.fixture(scope="module")
def botchan(shared_dir):
    return (shared_dir / "corpus" / "botchan.txt").read_text(encoding="utf-8")


def test_incremental_counts_give_the_same_merges_as_recounting(botchan):
    texts = [botchan[:20000]]
    result = train_bpe(texts, 400, PATTERN)
    tokens, merges = naive_train(texts, 400)
    assert result.tokens == tokens
    assert [(result.tokens[a], result.tokens[b]) for a, b in result.merges] == merges


def test_ties_go_to_the_lexicographically_smallest_pair():
    # (a, b), (b, c), (c, d) and (d, a) each occur once or twice: "ab" and "cd" twice, and
    # (a, b) < (c, d), so "ab" is merged first.
    result = train_bpe(["cdab", "abcd"], 257, PATTERN)
    assert result.tokens[256] == b"ab"


def test_training_is_deterministic(botchan):
    first = train_bpe([botchan[:50000]], 600, PATTERN)
    second = train_bpe([botchan[:50000]], 600, PATTERN)
    assert first.tokens == second.tokens and first.merges == second.merges


def test_written_files_encode_the_same_in_ember_tiktoken_and_tokenizers(
    botchan, shared_dir, tmp_path
):
    tiktoken = pytest.importorskip("tiktoken")
    tokenizers = pytest.importorskip("tokenizers")
    result = train_bpe([botchan], 1500, PATTERN, special_tokens=["<|endoftext|>"])
    assert result.vocab_size == 1500
    result.write_tiktoken(tmp_path / "trained.tiktoken")
    result.write_tokenizer_json(tmp_path / "tokenizer.json")
    ours_json = load(tmp_path / "tokenizer.json")
    ours_ranks = load_tiktoken(
        tmp_path / "trained.tiktoken", pattern="cl100k", special_tokens={"<|endoftext|>": 1499}
    )
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    reference = tiktoken.Encoding(
        name="trained",
        pat_str=PATTERN,
        mergeable_ranks=result.ranks(),
        special_tokens={"<|endoftext|>": 1499},
    )
    for text in build_corpus(shared_dir, count=1000, seed=30, specials=("<|endoftext|>",)):
        assert ours_json.encode(text) == hf.encode(text).ids
        assert ours_ranks.encode(text) == reference.encode(text, allowed_special="all")
        assert ours_json.decode(ours_json.encode(text)) == text


@pytest.mark.slow
def test_trains_32k_on_10mb_in_minutes(shared_dir):
    texts = [
        (shared_dir / "corpus" / name).read_text(encoding="utf-8")
        for name in ("kjv.txt", "tinyshakespeare.txt", "botchan.txt")
    ]
    total = sum(len(text.encode()) for text in texts)
    for path in sorted(Path(os.__file__).parent.rglob("*.py")):
        if total >= 10_000_000:
            break
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
        total += len(texts[-1].encode())
    start = time.perf_counter()
    result = train_bpe(texts, 32000, PATTERN)
    assert result.vocab_size == 32000
    assert time.perf_counter() - start < 300
