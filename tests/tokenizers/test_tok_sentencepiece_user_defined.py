"""SentencePiece `.model` files with user-defined pieces, against sentencepiece.

sentencepiece normalises the whole text first (one dummy prefix at its very start, whitespace
handled across user-defined pieces, which stay whole) and only then matches user-defined pieces
in the normalised text. Tolerance: none, for encode and for decode of sentencepiece's ids.
"""

from __future__ import annotations

import pytest

from ember.tokenizers import load

TURN_PIECES = ["<|im_start|>", "<|im_end|>"]
TEXTS = [
    "<|im_start|>",
    "<|im_start|>user",
    "hi<|im_end|>",
    "hi<|im_end|>there",
    "a <|im_end|> b",
    "<|im_start|<|im_end|>|>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "  <|im_start|>  user  <|im_end|>  ",
    " <|im_end|>",
    "<|im_end|> ",
    "ｆｕｌｌ<|im_start|>ｗｉｄｔｈ",
]
MODELS = {
    "bpe_byte_fallback": {"model_type": "bpe", "byte_fallback": True},
    "unigram": {"model_type": "unigram"},
    "bpe_keeping_whitespace": {"model_type": "bpe", "remove_extra_whitespaces": False},
    "gemma_like": {
        "model_type": "bpe",
        "byte_fallback": True,
        "normalization_rule_name": "identity",
        "add_dummy_prefix": False,
        "remove_extra_whitespaces": False,
        "user_defined_symbols": ["▁▁", "▁▁▁▁", "\t\t", "\n\n", *TURN_PIECES],
    },
}
GEMMA_TEXTS = ["a  b", "    x", "\t\tfoo", "x\n\ny", "▁▁literal", "a ▁▁ b", "  <|im_end|>  "]


@pytest.fixture(scope="module", params=sorted(MODELS))
def models(request, shared_dir, tmp_path_factory):
    """(ember's tokenizer, sentencepiece's processor) of one model trained on botchan.txt."""
    spm = pytest.importorskip("sentencepiece")
    options = {"user_defined_symbols": TURN_PIECES, **MODELS[request.param]}
    prefix = tmp_path_factory.mktemp("spm") / request.param
    spm.SentencePieceTrainer.train(
        input=str(shared_dir / "corpus" / "botchan.txt"),
        model_prefix=str(prefix),
        vocab_size=1000,
        minloglevel=2,
        **options,
    )
    path = prefix.with_suffix(".model")
    return load(path), spm.SentencePieceProcessor(model_file=str(path))


@pytest.mark.parametrize("text", TEXTS + GEMMA_TEXTS)
def test_user_defined_pieces_are_matched_in_the_normalised_text(models, text):
    ours, reference = models
    expected = reference.encode(text)
    assert ours.encode(text, allowed_special=()) == expected
    assert ours.decode(expected) == reference.decode(expected)
