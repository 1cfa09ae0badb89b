"""Byte-fallback pieces that do not form valid UTF-8, decoded in full and streamed, against
sentencepiece on Llama 2's tokenizer.model: every invalid byte becomes its own U+FFFD (Python's
and tiktoken's rule would give one per invalid sequence). Tolerance: none."""

from __future__ import annotations

import random

import pytest

from ember.tokenizers import IncrementalDecoder

FIRST_BYTE_PIECE = 3  # Llama 2's <0x00>; <0xNN> is id 3 + NN


def streamed(tokenizer, ids: list[int]) -> str:
    decoder = IncrementalDecoder(tokenizer)
    return decoder.push_many(ids) + decoder.flush()


@pytest.fixture(scope="module")
def llama2(shared_dir, load_shared):
    spm = pytest.importorskip("sentencepiece")
    path = shared_dir / "tokenizers" / "llama2" / "tokenizer.model"
    return load_shared("tokenizers/llama2/tokenizer.model"), spm.SentencePieceProcessor(model_file=str(path))


@pytest.mark.parametrize("run", [[0xE9, 0xBE], [0x49, 0xAD], [0xE6, 0x97], [0xF0, 0x9F, 0x98], [0xED, 0xA0, 0x80]])
def test_each_invalid_byte_decodes_to_one_replacement_like_sentencepiece(llama2, run):
    ours, reference = llama2
    the = reference.piece_to_id("▁the")
    run_ids = [FIRST_BYTE_PIECE + byte for byte in run]
    for ids in (run_ids, run_ids + [the], [the, *run_ids, the, *run_ids]):
        assert ours.decode(ids) == reference.decode(ids), ids
        assert streamed(ours, ids) == reference.decode(ids), ids


def test_random_byte_runs_between_words_decode_like_sentencepiece(llama2):
    ours, reference = llama2
    words = reference.encode("hello the world")
    rng = random.Random(5)
    for _ in range(500):
        ids = [words[0]]
        for _ in range(rng.randint(1, 3)):
            ids += [FIRST_BYTE_PIECE + rng.randrange(256) for _ in range(rng.randint(1, 4))]
            ids.append(rng.choice(words))
        assert ours.decode(ids) == reference.decode(ids), ids
        assert streamed(ours, ids) == reference.decode(ids), ids
