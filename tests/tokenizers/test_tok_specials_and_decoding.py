"""tiktoken's allowed_special / disallowed_special semantics, decoding of invalid UTF-8, and
the streaming decoder, on cl100k (reference: tiktoken)."""

from __future__ import annotations

import pytest
from test_tok_parity import tiktoken_reference

from ember.tokenizers import IncrementalDecoder, load


@pytest.fixture(scope="module")
def cl100k(shared_dir):
    return load(shared_dir / "tokenizers/tiktoken/cl100k_base.tiktoken")


@pytest.fixture(scope="module")
def cl100k_reference(shared_dir):
    return tiktoken_reference(shared_dir, "tiktoken/cl100k_base.tiktoken", "cl100k_base")


TEXT = "a<|endoftext|>b<|fim_prefix|>c"


def test_disallowed_special_text_raises_like_tiktoken(cl100k, cl100k_reference):
    with pytest.raises(ValueError):
        cl100k_reference.encode(TEXT)
    with pytest.raises(ValueError, match="disallowed"):
        cl100k.encode(TEXT, allowed_special=(), disallowed_special="all")


@pytest.mark.parametrize(
    "allowed, disallowed",
    [("all", set()), (set(), set()), ({"<|endoftext|>"}, set()), ({"<|fim_prefix|>"}, set())],
)
def test_allowed_special_subsets_match_tiktoken(cl100k, cl100k_reference, allowed, disallowed):
    expected = cl100k_reference.encode(TEXT, allowed_special=allowed, disallowed_special=disallowed)
    assert cl100k.encode(TEXT, allowed_special=allowed, disallowed_special=disallowed) == expected


def test_decoding_invalid_utf8_replaces_like_tiktoken(cl100k, cl100k_reference):
    ids = cl100k_reference.encode("日本語 🙂 ok")
    for cut in range(len(ids) + 1):
        for piece in (ids[:cut], ids[cut:], ids[1:cut]):
            assert cl100k.decode(piece) == cl100k_reference.decode(piece, errors="replace")


def test_streaming_decoder_never_emits_broken_characters(cl100k):
    text = "emoji 👨‍👩‍👧 and 日本語 and é"
    ids = cl100k.encode(text)
    decoder = IncrementalDecoder(cl100k)
    chunks = [decoder.push(token_id) for token_id in ids]
    assert "\ufffd" not in "".join(chunks)
    assert "".join(chunks) + decoder.flush() == text


def test_lone_surrogates_are_replaced_as_tiktoken_does(cl100k, cl100k_reference):
    text = "a\ud800b"
    assert cl100k.encode(text) == cl100k_reference.encode(text)
