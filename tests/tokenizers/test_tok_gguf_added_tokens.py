"""How GGUF vocabularies match added tokens in text, as llama.cpp's tokenizer_st_partition does:
user-defined tokens (type 4) are ordinary vocabulary, matched in every text even when special
tokens are not (`allowed_special=()`, llama.cpp's parse_special=false); control tokens (3) only
when allowed; and the longest token is cut out of the whole text first. The same holds for
non-special added tokens of a tokenizer.json (reference: `tokenizers`)."""

from __future__ import annotations

import json

import pytest
from tok_gguf_writer import write_vocab_gguf

from ember.tokenizers import load
from ember.tokenizers.text.specials import SpecialTokenMatcher

CHARS = [chr(c) for c in range(0x21, 0x7F)]  # printable ASCII: one token each, no merges
ADDED = len(CHARS)  # the first added token's id


def plain(text: str) -> list[int]:
    return [CHARS.index(char) for char in text]


def _gguf(tmp_path, added: dict[str, int]):
    """Printable ASCII as normal tokens, then `added` texts with their GGUF token types."""
    path = tmp_path / "vocab.gguf"
    write_vocab_gguf(
        path,
        "gpt2",
        tokens=[*CHARS, *added],
        types=[1] * len(CHARS) + list(added.values()),
        token_merges=[],
        tokenizer_pre="gpt-2",
    )
    return load(path)


def test_user_defined_tokens_are_matched_even_without_special_tokens(tmp_path):
    ours = _gguf(tmp_path, {"bc": 4, "<s>": 3})
    assert ours.encode("abc<s>", allowed_special=()) == [*plain("a"), ADDED, *plain("<s>")]
    assert ours.encode("abc<s>") == [*plain("a"), ADDED, ADDED + 1]
    assert not ours.is_special(ADDED) and ours.is_special(ADDED + 1)
    assert ours.decode(ours.encode("abc<s>")) == "abc<s>"


def test_the_longest_token_is_cut_out_first_as_llama_cpp_does(tmp_path):
    # leftmost-longest (tiktoken, HF) would take "abc" then "de"; llama.cpp takes "bcde" first.
    ours = _gguf(tmp_path, {"abc": 4, "bcde": 4})
    assert ours.encode("abcde", allowed_special=()) == [*plain("a"), ADDED + 1]
    assert ours.encode("xabcdeabc", allowed_special=()) == [*plain("xa"), ADDED + 1, ADDED]


def test_matcher_orders_leftmost_longest_or_longest_first():
    tokens = {"abc": 1, "bcde": 2, "e": 3}
    for longest_first, expected in (
        (False, [("abc", 1), ("d", None), ("e", 3)]),
        (True, [("a", None), ("bcde", 2)]),
    ):
        matcher = SpecialTokenMatcher(tokens, longest_first=longest_first)
        assert list(matcher.split("abcde", frozenset(tokens))) == expected


def test_non_special_added_tokens_of_tokenizer_json_are_always_matched(shared_dir, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads((shared_dir / "tokenizers/smollm2/tokenizer.json").read_text("utf-8"))
    size = max(spec["model"]["vocab"].values()) + 1
    spec["added_tokens"].append(
        {"id": size, "content": "zq", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": False}
    )  # fmt: skip
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    reference = tokenizers.Tokenizer.from_file(str(path))
    ours = load(path)
    text = "a zq b<|im_start|>"
    expected = reference.encode(text, add_special_tokens=False).ids
    assert size in expected
    assert ours.encode(text) == expected
    assert size in ours.encode(text, allowed_special=())
