"""Token-for-token parity with the reference libraries on the 5,000-sample corpus.

References: tiktoken for r50k/p50k/cl100k/o200k, GPT-2's encoder.json + vocab.bpe and
Llama 3 (with Llama 3's pattern); `tokenizers` for SmolLM2 and Qwen2.5 tokenizer.json;
sentencepiece for Llama 2's tokenizer.model. Tolerance: none, every id must match, and
decode(encode(x)) == x for every sample.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tok_corpus import build_corpus

from ember.tokenizers.formats.tiktoken_files import KNOWN_ENCODINGS
from ember.tokenizers.text.patterns import NAMED_PATTERNS

TIKTOKEN_CASES = {
    "r50k": ("tiktoken/r50k_base.tiktoken", "r50k_base"),
    "p50k": ("tiktoken/p50k_base.tiktoken", "p50k_base"),
    "cl100k": ("tiktoken/cl100k_base.tiktoken", "cl100k_base"),
    "o200k": ("tiktoken/o200k_base.tiktoken", "o200k_base"),
    "llama3": ("llama3/tokenizer.model", "llama3"),
    "gpt2-folder": ("gpt2", "r50k_base"),
}
CORPUS_SIZE = 5000


def tiktoken_reference(shared_dir: Path, rank_file: str, encoding: str):
    """A tiktoken Encoding built from the shared rank file (tiktoken cannot download here)."""
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe

    spec = KNOWN_ENCODINGS[encoding]
    return tiktoken.Encoding(
        name=encoding,
        pat_str=NAMED_PATTERNS[spec.pattern_name],
        mergeable_ranks=load_tiktoken_bpe(str(shared_dir / "tokenizers" / rank_file)),
        special_tokens=spec.special_tokens,
    )


def assert_parity(ours, reference_encode, corpus: list[str]) -> None:
    mismatches = []
    for index, text in enumerate(corpus):
        expected = reference_encode(text)
        got = ours.encode(text)
        if got != expected:
            mismatches.append((index, text[:60], got[:12], expected[:12]))
        elif ours.decode(got) != text:
            mismatches.append((index, text[:60], "decode", ours.decode(got)[:60]))
    assert mismatches == [], f"{len(mismatches)} of {len(corpus)} differ, first: {mismatches[:3]}"


@pytest.mark.parametrize("case", sorted(TIKTOKEN_CASES))
def test_matches_tiktoken_on_the_parity_corpus(shared_dir, load_shared, case):
    _, encoding = TIKTOKEN_CASES[case]
    reference = tiktoken_reference(
        shared_dir, TIKTOKEN_CASES["r50k" if case == "gpt2-folder" else case][0], encoding
    )
    ours = load_shared("tokenizers/" + TIKTOKEN_CASES[case][0])
    specials = tuple(KNOWN_ENCODINGS[encoding].special_tokens)[:6]
    corpus = build_corpus(shared_dir, count=CORPUS_SIZE, seed=10, specials=specials)
    assert_parity(ours, lambda text: reference.encode(text, allowed_special="all"), corpus)


@pytest.mark.parametrize("folder", ["smollm2", "qwen2.5"])
def test_matches_hf_tokenizers_on_the_parity_corpus(shared_dir, load_shared, folder):
    tokenizers = pytest.importorskip("tokenizers")
    path = shared_dir / "tokenizers" / folder / "tokenizer.json"
    reference = tokenizers.Tokenizer.from_file(str(path))
    ours = load_shared(f"tokenizers/{folder}/tokenizer.json")
    specials = tuple(ours.special_tokens)[:8]
    corpus = build_corpus(shared_dir, count=CORPUS_SIZE, seed=11, specials=specials)
    assert_parity(ours, lambda text: reference.encode(text).ids, corpus)


def test_llama2_model_matches_sentencepiece_on_the_parity_corpus(shared_dir, load_shared):
    spm = pytest.importorskip("sentencepiece")
    path = shared_dir / "tokenizers" / "llama2" / "tokenizer.model"
    reference = spm.SentencePieceProcessor(model_file=str(path))
    ours = load_shared("tokenizers/llama2/tokenizer.model")
    corpus = build_corpus(shared_dir, count=CORPUS_SIZE, seed=12)
    mismatches = []
    for index, text in enumerate(corpus):
        expected = reference.encode(text)
        # sentencepiece never matches control-token text such as "<s>" inside input.
        got = ours.encode(text, allowed_special=())
        if got != expected:
            mismatches.append((index, text[:60], got[:12], expected[:12]))
        elif not ours.decode(got) == reference.decode(expected) == text:
            mismatches.append((index, text[:60], "decode"))
    assert mismatches == [], f"{len(mismatches)} differ, first: {mismatches[:3]}"
