"""HF added tokens with `lstrip` / `rstrip` / `single_word` (reference: `tokenizers`), and parts
ember does not know are refused, not approximated."""

from __future__ import annotations

import json

import pytest
from tok_corpus import build_corpus

from ember.tokenizers import load


def with_added_tokens(shared_dir, tmp_path, entries):
    spec = json.loads((shared_dir / "tokenizers/smollm2/tokenizer.json").read_text("utf-8"))
    for entry in spec["added_tokens"]:
        entry.update(entries.get(entry["content"], {}))
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def test_lstrip_and_rstrip_tokens_absorb_whitespace_like_tokenizers(shared_dir, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    path = with_added_tokens(
        shared_dir,
        tmp_path,
        {
            "<|im_start|>": {"lstrip": True},
            "<|im_end|>": {"rstrip": True},
            "<repo_name>": {"lstrip": True, "rstrip": True},
        },
    )
    ours = load(path)
    reference = tokenizers.Tokenizer.from_file(str(path))
    specials = ("<|im_start|>", "<|im_end|>", "<repo_name>", "<file_sep>")
    samples = ["a  <|im_start|>  b", "x <|im_end|> \n y", " <repo_name> ", "\t<|im_end|>\t"]
    for text in samples + build_corpus(shared_dir, count=500, seed=70, specials=specials):
        assert ours.encode(text) == reference.encode(text).ids, text


def test_single_word_added_tokens_match_only_between_non_word_characters(shared_dir, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    path = with_added_tokens(
        shared_dir, tmp_path, {"<|im_end|>": {"single_word": True, "rstrip": True}}
    )
    ours = load(path)
    reference = tokenizers.Tokenizer.from_file(str(path))
    samples = ["a<|im_end|>b", "a <|im_end|> b", "<|im_end|>x", "é<|im_end|>", "_<|im_end|>."]
    specials = ("<|im_start|>", "<|im_end|>")
    for text in samples + build_corpus(shared_dir, count=200, seed=71, specials=specials):
        assert ours.encode(text) == reference.encode(text).ids, text


def test_an_unknown_model_type_is_refused_with_its_name(shared_dir, tmp_path):
    spec = json.loads((shared_dir / "tokenizers/smollm2/tokenizer.json").read_text("utf-8"))
    spec["model"]["type"] = "WordLevelPlus"
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match="'WordLevelPlus' is not supported"):
        load(path)


def test_a_template_that_starts_with_a_special_token_means_add_bos(shared_dir, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads((shared_dir / "tokenizers/smollm2/tokenizer.json").read_text("utf-8"))
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}
        },
    }
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    ours = load(path)
    reference = tokenizers.Tokenizer.from_file(str(path))
    assert (ours.add_bos, ours.bos_id) == (True, 1)
    assert ours.encode("Hi there", add_special_tokens=True) == reference.encode("Hi there").ids
    assert ours.encode("Hi there") == reference.encode("Hi there", add_special_tokens=False).ids
