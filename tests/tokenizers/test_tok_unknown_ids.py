"""Ids with no token (past the vocabulary, or a gap in it) decode to nothing, in full and streamed.

A model's logits may be wider than its tokenizer's vocabulary (Qwen2.5: 151,936 logits for
151,665 tokens), so sampling can yield such an id. Reference: `tokenizers`, which skips them;
tiktoken and sentencepiece refuse them, so there ember must equal their decode of the ids
that do have a token. Tolerance: none.
"""

from __future__ import annotations

import pytest
from test_tok_parity import tiktoken_reference

from ember.tokenizers import IncrementalDecoder

PAST_THE_END = 10**6


def streamed(tokenizer, ids: list[int], skip_special_tokens: bool = False) -> str:
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
    return decoder.push_many(ids) + decoder.flush()


@pytest.mark.parametrize("folder", ["smollm2", "minilm"])
def test_tokenizer_json_skips_unknown_ids_like_tokenizers(shared_dir, load_shared, folder):
    tokenizers = pytest.importorskip("tokenizers")
    path = shared_dir / "tokenizers" / folder / "tokenizer.json"
    reference = tokenizers.Tokenizer.from_file(str(path))
    ours = load_shared(f"tokenizers/{folder}/tokenizer.json")
    known = reference.encode("hello world", add_special_tokens=True).ids
    size = reference.get_vocab_size(with_added_tokens=True)
    for ids in ([size], [*known, PAST_THE_END], [size, *known], [known[0], size + 5, *known[1:]]):
        for skip in (False, True):
            expected = reference.decode(ids, skip_special_tokens=skip)
            assert ours.decode(ids, skip_special_tokens=skip) == expected, (ids, skip)
            assert streamed(ours, ids, skip) == expected, (ids, skip)


def test_sentencepiece_model_skips_unknown_ids_and_keeps_the_text_start(shared_dir, load_shared):
    spm = pytest.importorskip("sentencepiece")
    reference = spm.SentencePieceProcessor(
        model_file=str(shared_dir / "tokenizers" / "llama2" / "tokenizer.model")
    )
    ours = load_shared("tokenizers/llama2/tokenizer.model")
    known = reference.encode("hello world")  # "▁hello": the start must still drop its space
    size = reference.get_piece_size()
    for ids in ([size, *known], [-1, *known], [known[0], PAST_THE_END, *known[1:]]):
        assert ours.decode(ids) == reference.decode(known), ids
        assert streamed(ours, ids) == reference.decode(known), ids


def test_tiktoken_vocabulary_gaps_decode_to_nothing(shared_dir, load_shared):
    reference = tiktoken_reference(shared_dir, "tiktoken/cl100k_base.tiktoken", "cl100k_base")
    ours = load_shared("tokenizers/tiktoken/cl100k_base.tiktoken")
    known = reference.encode("hello world")
    gap = 100256  # between cl100k's last rank and <|endoftext|> (100257)
    ids = [known[0], gap, *known[1:], ours.vocab_size, PAST_THE_END]
    assert ours.decode(ids) == reference.decode(known)
    assert streamed(ours, ids) == reference.decode(known)
    assert not ours.has_token(gap) and ours.has_token(known[0])
