"""GGUF tokenizer metadata -> ember tokenizer, checked against the `tokenizers` library
on SmolLM2's tokenizer.json (token-for-token parity, no tolerance)."""

from __future__ import annotations

import pytest
from tok_corpus import build_corpus

from ember.gguf_file import read_gguf_metadata
from ember.tokenizers import ByteLevelBPETokenizer, load

SMOLLM_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>")


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    return load(smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2_reference(shared_dir):
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(shared_dir / "tokenizers/smollm2/tokenizer.json"))


def test_smollm2_gguf_loads_as_byte_level_bpe_with_its_special_ids(smollm2):
    assert isinstance(smollm2, ByteLevelBPETokenizer)
    assert smollm2.vocab_size == 49152
    assert (smollm2.bos_id, smollm2.eos_id) == (1, 2)
    assert smollm2.eos_ids == {0, 2}  # <|im_end|> (EOS) and <|endoftext|>
    assert smollm2.add_bos is False
    assert "<|im_start|>" in smollm2.chat_template
    assert smollm2.is_special(1) and not smollm2.is_special(100)


def test_smollm2_chat_markup_is_matched_as_special_tokens(smollm2):
    ids = smollm2.encode("<|im_start|>user\nHi<|im_end|>\n")
    assert ids[0] == 1 and 2 in ids
    assert smollm2.decode(ids, skip_special_tokens=True) == "user\nHi\n"


def test_smollm2_splits_digits_one_by_one(smollm2):
    ids = smollm2.encode("2024")
    assert [smollm2.decode([i]) for i in ids] == ["2", "0", "2", "4"]


def test_smollm2_gguf_matches_tokenizers_on_the_parity_corpus(
    shared_dir, smollm2, smollm2_reference
):
    corpus = build_corpus(shared_dir, count=5000, specials=SMOLLM_SPECIALS)
    mismatches = []
    for index, text in enumerate(corpus):
        expected = smollm2_reference.encode(text).ids
        got = smollm2.encode(text)
        if got != expected:
            mismatches.append((index, text[:80], got[:20], expected[:20]))
        elif smollm2.decode(got) != text:
            mismatches.append((index, text[:80], "decode", smollm2.decode(got)[:80]))
    assert mismatches == [], f"{len(mismatches)} mismatches, first: {mismatches[:3]}"


def test_metadata_reader_agrees_with_the_gguf_package(smollm2_gguf):
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(smollm2_gguf))
    ours = read_gguf_metadata(smollm2_gguf, prefixes=("tokenizer.", "general."))
    for key, field in reader.fields.items():
        if key.startswith(("tokenizer.", "general.")):
            assert ours[key] == field.contents(), key
