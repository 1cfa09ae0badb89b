"""llama2.c tokenizer.bin files, checked against a line-by-line model of run.c's encoder and,
for the Llama 2 vocabulary, against `sentencepiece` on the same vocabulary's .model file."""

from __future__ import annotations

import shutil

import pytest
from tok_corpus import build_corpus

from ember.tokenizers import SentencePieceBPETokenizer, load
from ember.tokenizers.formats.llama2c import read_llama2c_vocab


def run_c_encode(pieces: list[str], scores: list[float], text: str) -> list[int]:
    """run.c's encode() without BOS/EOS, transcribed: the test oracle (quadratic, plain)."""
    lookup: dict[str, int] = {}
    for token_id, piece in enumerate(pieces):
        lookup.setdefault(piece, token_id)
    tokens: list[int] = []
    if text:
        tokens.append(lookup[" "])
    for char in text:
        if char in lookup:
            tokens.append(lookup[char])
        else:
            tokens.extend(byte + 3 for byte in char.encode("utf-8"))
    while True:
        best_score, best_id, best_at = -1e10, -1, -1
        for at in range(len(tokens) - 1):
            merged = pieces[tokens[at]] + pieces[tokens[at + 1]]
            token_id = lookup.get(merged, -1)
            if token_id != -1 and scores[token_id] > best_score:
                best_score, best_id, best_at = scores[token_id], token_id, at
        if best_at == -1:
            return tokens
        tokens[best_at : best_at + 2] = [best_id]


@pytest.fixture(scope="module")
def tok512(stories_dir):
    return load(stories_dir / "tok512.bin")


def test_tokenizer_bin_is_recognised_by_content_not_name(stories_dir, tmp_path):
    renamed = tmp_path / "vocabulary.data"
    shutil.copy(stories_dir / "tok512.bin", renamed)
    tokenizer = load(renamed)
    assert isinstance(tokenizer, SentencePieceBPETokenizer)
    assert (tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id) == (512, 1, 2)


def test_encode_adds_bos_and_decode_strips_the_dummy_space(tok512):
    ids = tok512.encode("Once upon a time", add_special_tokens=True)
    assert ids[0] == 1
    assert tok512.decode(ids, skip_special_tokens=True) == "Once upon a time"
    assert tok512.encode("") == []


def test_unknown_characters_fall_back_to_byte_pieces(tok512):
    ids = tok512.encode("語")  # not in the 512-piece vocabulary: E8 AA 9E
    assert ids[-3:] == [0xE8 + 3, 0xAA + 3, 0x9E + 3]
    assert tok512.decode(ids) == "語"


def test_tok512_matches_run_c_on_the_parity_corpus(shared_dir, stories_dir, tok512):
    _, pieces, scores = read_llama2c_vocab((stories_dir / "tok512.bin").read_bytes())
    corpus = [text[:120] for text in build_corpus(shared_dir, count=600, seed=1)]
    for index, text in enumerate(corpus):
        assert tok512.encode(text) == run_c_encode(pieces, scores, text), (index, text)
        assert tok512.decode(tok512.encode(text)) == text, (index, text)


def test_llama2_tokenizer_bin_matches_sentencepiece_on_the_parity_corpus(shared_dir):
    spm = pytest.importorskip("sentencepiece")
    reference = spm.SentencePieceProcessor(
        model_file=str(shared_dir / "tokenizers/llama2/tokenizer.model")
    )
    ours = load(shared_dir / "tokenizers/llama2/tokenizer.bin")
    mismatches = []
    for index, text in enumerate(build_corpus(shared_dir, count=5000, seed=2)):
        if ours.encode(text) != reference.encode(text):
            mismatches.append((index, text[:60]))
    assert mismatches == [], f"{len(mismatches)} mismatches, first: {mismatches[:5]}"
