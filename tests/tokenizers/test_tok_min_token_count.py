"""`min_token_count(text)` never exceeds `len(encode(text))`, so a server can refuse by length alone.

Given each shared vocabulary, for adversarial texts (long runs, the longest tokens' own bytes,
CJK, emoji, lone surrogates, special-token text) and random BMP text, the bound holds (the
other planes wait on `encode` being total there, issue 16's first defect); it
is positive for byte-level BPE (so over-long prompts are refused without tokenizing) and 0 where
text may be folded (SentencePiece normalization), where no length bound is sound.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.tokenizers import load

BYTE_LEVEL = ("smollm2", "qwen2.5", "gpt2", "llama3/tokenizer.model", "tiktoken/cl100k_base.tiktoken")


@pytest.fixture(scope="module", params=BYTE_LEVEL)
def byte_level(request: pytest.FixtureRequest, shared_dir: Path):
    path = shared_dir / "tokenizers" / request.param
    if not path.exists():
        pytest.skip(f"{path} is missing from the shared assets")
    return load(path)


def vocabulary(tokenizer) -> dict[int, bytes]:
    """id -> bytes of every id in use (some vocabularies, e.g. cl100k, leave gaps)."""
    found = {}
    for token in range(tokenizer.vocab_size):
        try:
            found[token] = tokenizer.token_bytes(token)
        except ValueError:
            continue
    return found


def adversarial_texts(tokenizer) -> list[str]:
    pieces = vocabulary(tokenizer)
    longest_text = max(pieces.values(), key=len).decode("utf-8", errors="replace")
    specials = "".join(data.decode("utf-8", "replace") for t, data in pieces.items() if tokenizer.is_special(t))
    return [
        longest_text * 50,
        "a" * 5000,
        " " * 3000,
        "\n" * 1000,
        "".join(chr(cp) for cp in range(0x4E00, 0x4E00 + 2000, 7)),
        "\U0001f600" * 100,
        "a\ud800b\udfffc" * 50,
        specials * 5,
        "9" * 4000,
    ]


def test_the_bound_holds_on_adversarial_text_and_is_positive(byte_level) -> None:
    for text in adversarial_texts(byte_level):
        bound = byte_level.min_token_count(text)
        assert 0 < bound <= len(byte_level.encode(text)), (text[:40], bound)


@given(text=st.text(alphabet=st.characters(max_codepoint=0xFFFF), max_size=400))
@settings(max_examples=60, deadline=None)
def test_the_bound_holds_on_random_text(byte_level, text: str) -> None:
    assert byte_level.min_token_count(text) <= len(byte_level.encode(text))


def test_a_normalizing_sentencepiece_vocabulary_claims_no_bound(shared_dir: Path) -> None:
    path = shared_dir / "tokenizers" / "llama2" / "tokenizer.model"
    if not path.is_file():
        pytest.skip(f"{path} is missing from the shared assets")
    tokenizer = load(path)
    assert tokenizer.min_token_count(" " * 10_000) == 0
