"""SentencePiece .model files made with sentencepiece's default settings (nmt_nfkc rules
compiled into the file, extra whitespace removed, no byte fallback): ember must encode and
decode exactly as sentencepiece does, for Unigram and BPE models."""

from __future__ import annotations

import pytest
from tok_corpus import build_corpus

from ember.tokenizers import load

EDGE_CASES = [
    "ｆｕｌｌ　ｗｉｄｔｈ ①②③ ﬁ ㍿ Å Å",
    "\t tab\nnew line \u00a0nbsp  double  spaces  ",
    "   leading and trailing   ",
    "\u2581literal marker\u2581",
    "unknown 我们今天 runs ☃☃",
    "",
    " ",
]


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def default_model(request, shared_dir, tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    prefix = tmp_path_factory.mktemp("spm") / f"botchan_{request.param}"
    spm.SentencePieceTrainer.train(
        input=str(shared_dir / "corpus" / "botchan.txt"),
        model_prefix=str(prefix),
        vocab_size=1000,
        model_type=request.param,
        minloglevel=2,
    )
    path = prefix.with_suffix(".model")
    return load(path), spm.SentencePieceProcessor(model_file=str(path))


def test_default_sentencepiece_models_encode_and_decode_exactly(shared_dir, default_model):
    ours, reference = default_model
    corpus = EDGE_CASES + build_corpus(shared_dir, count=2000, seed=60)
    for text in corpus:
        expected = reference.encode(text)
        assert ours.encode(text, allowed_special=()) == expected, text
        assert ours.decode(expected) == reference.decode(expected), text
