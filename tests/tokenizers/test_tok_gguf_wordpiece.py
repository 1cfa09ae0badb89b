"""GGUF "bert" vocabularies run with llama.cpp's WordPiece rules (llama-vocab.cpp, WPM), on a
tiny vocabulary whose expected ids follow from those rules; the real bert-bge vocabulary is
checked against llama.cpp's vectors in test_tok_llama_cpp_vectors.py."""

from __future__ import annotations

import pytest
from tok_gguf_writer import write_vocab_gguf

from ember.tokenizers import load

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
WORDS = ["▁hello", "▁world", "▁,", "▁!", "▁un", "aff", "able", "▁ᄂ", "▁中", "▁文", "▁[", "▁]"]
TOKENS = SPECIALS + WORDS
PAD, UNK, CLS, SEP = range(4)


def ids(*tokens: str) -> list[int]:
    return [TOKENS.index(token) for token in tokens]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert") / "vocab.gguf"
    write_vocab_gguf(
        path,
        "bert",
        tokens=TOKENS,
        types=[3] * len(SPECIALS) + [1] * len(WORDS),
        unk_token_id=UNK,
        bos_token_id=CLS,
        sep_token_id=SEP,
    )
    return load(path)


@pytest.mark.parametrize(
    "text, expected",
    [
        # lowercased, accents dropped, punctuation its own word
        ("Héllo, WORLD!", ids("▁hello", "▁,", "▁world", "▁!")),
        ("unaffable", ids("▁un", "aff", "able")),  # greedy longest match, then continuations
        ("unaffables hello", [UNK, *ids("▁hello")]),  # a part that matches nothing: [UNK]
        ("나", ids("▁ᄂ")),  # a Hangul syllable becomes the first code point of its NFD form
        ("中文", ids("▁中", "▁文")),  # CJK ideographs are words of their own
        ("hel\u200blo\x00 \u3000world\u2028", ids("▁hello", "▁world")),  # \p{C} dropped
        ("", []),
    ],
)
def test_llama_cpp_wordpiece_rules(bert, text, expected):
    assert bert.encode(text, allowed_special=()) == expected


def test_special_tokens_and_the_cls_sep_frame(bert):
    assert bert.encode("[CLS] hello") == [CLS, *ids("▁hello")]
    assert bert.encode("[CLS]", allowed_special=()) == [*ids("▁["), UNK, *ids("▁]")]
    assert bert.encode("hello", add_special_tokens=True) == [CLS, *ids("▁hello"), SEP]
    assert (bert.bos_id, bert.eos_id, bert.add_bos) == (CLS, SEP, True)


def test_decoding_turns_the_word_marker_into_a_space(bert):
    assert bert.decode(ids("▁hello", "▁un", "aff", "able", "▁!")) == "hello unaffable !"
    assert bert.decode([CLS, *ids("▁hello")], skip_special_tokens=True) == "hello"
