"""Korean and Hindi (and English) from Firefox's language packs, token for token.

The text is real: Firefox's messages in each language (Debian's firefox-esr-l10n-* packages,
which .ci/fetch-firefox-l10n downloads; ember/tokenizers/deb_text.py reads them). References:
llama.cpp itself (llama-cpp-python, vocab_only) for the llama.cpp vocab GGUFs whose
pre-tokenizers issue 15 added or fixed; `tokenizers` for the shared tokenizer.json files;
sentencepiece for Llama 2. Tolerance: none, and decode(encode(x)) == x where the tokenizer
keeps text as it is. A sample of messages per language keeps this to seconds; without the
packs these tests skip and say how to get them.
"""

from __future__ import annotations

import pytest

from ember.bench.tokenizer_languages import (
    firefox_l10n_dir,
    llama_cpp_models_dir,
    load_parallel_texts,
)
from ember.tokenizers import load
from ember.tokenizers.deb_text import find_language_packs

MESSAGES_PER_LANGUAGE = 300
# The vocabularies of llama.cpp's models/ whose pre-tokenizers issue 15 added (deepseek-llm,
# deepseek-coder, falcon, starcoder, refact, command-r, qwen35) or fixed (llama-bpe), and
# two that were there before.
GGUF_VOCABS = [
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "starcoder",
    "refact",
    "command-r",
    "qwen35",
    "llama-bpe",
    "qwen2",
    "gpt-2",
]


@pytest.fixture(scope="module")
def messages() -> list[str]:
    """An evenly spaced sample of the messages of each language, Korean and Hindi first."""
    try:
        texts = load_parallel_texts(firefox_l10n_dir())
    except FileNotFoundError as error:
        pytest.skip(str(error))
    sample = []
    for language in ("korean", "hindi", "english"):
        lines = [line for line in texts[language].splitlines() if line]
        sample += lines[:: max(1, len(lines) // MESSAGES_PER_LANGUAGE)]
    return sample


def mismatches_of(encode, reference_encode, decode, texts: list[str]) -> list[tuple]:
    found = []
    for text in texts:
        expected, got = reference_encode(text), encode(text)
        if got != expected:
            found.append((text[:40], got[:8], expected[:8]))
        elif decode is not None and decode(got) != text:
            found.append((text[:40], "decode", decode(got)[:40]))
    return found


@pytest.mark.parametrize("vocab", GGUF_VOCABS)
def test_llama_cpp_vocabularies_match_llama_cpp_on_korean_and_hindi(messages, vocab):
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed: llama.cpp parity not checked"
    )
    path = llama_cpp_models_dir() / f"ggml-vocab-{vocab}.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is absent: run .ci/fetch-llama-cpp-models")
    reference = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = load(path)
    found = mismatches_of(
        lambda text: ours.encode(text, allowed_special=()),
        lambda text: reference.tokenize(text.encode(), add_bos=False, special=False),
        ours.decode,
        messages,
    )
    assert found == [], f"{len(found)} of {len(messages)} differ, first: {found[:3]}"


@pytest.mark.parametrize(
    ("folder", "keeps_text"), [("smollm2", True), ("qwen2.5", True), ("minilm", False)]
)
def test_tokenizer_json_files_match_tokenizers_on_korean_and_hindi(
    shared_dir, load_shared, messages, folder, keeps_text
):
    tokenizers = pytest.importorskip("tokenizers")
    path = shared_dir / "tokenizers" / folder / "tokenizer.json"
    reference = tokenizers.Tokenizer.from_file(str(path))
    reference.no_truncation()
    reference.no_padding()
    ours = load_shared(f"tokenizers/{folder}/tokenizer.json")
    found = mismatches_of(
        lambda text: ours.encode(text, add_special_tokens=False),
        lambda text: reference.encode(text, add_special_tokens=False).ids,
        ours.decode if keeps_text else None,  # WordPiece lowercases and strips accents
        messages,
    )
    assert found == [], f"{len(found)} of {len(messages)} differ, first: {found[:3]}"


def test_llama2_model_matches_sentencepiece_on_korean_and_hindi(shared_dir, load_shared, messages):
    spm = pytest.importorskip("sentencepiece")
    reference = spm.SentencePieceProcessor(
        model_file=str(shared_dir / "tokenizers" / "llama2" / "tokenizer.model")
    )
    ours = load_shared("tokenizers/llama2/tokenizer.model")
    found = mismatches_of(
        lambda text: ours.encode(text, allowed_special=()), reference.encode, ours.decode, messages
    )
    assert found == [], f"{len(found)} of {len(messages)} differ, first: {found[:3]}"


def test_the_sample_holds_hangul_and_devanagari(messages):
    assert sum("가" <= char <= "힣" for text in messages for char in text) > 1000
    assert sum("\u0900" <= char <= "\u097f" for text in messages for char in text) > 1000


def test_language_packs_are_found_by_package_name(tmp_path):
    for name in (
        "firefox-esr-l10n-ko_140.1esr-1_all.deb",
        "firefox-esr-l10n-ko_140.2esr-1_all.deb",
        "firefox-esr-l10n-en-gb_140.1esr-1_all.deb",
        "firefox-esr-l10n-kok_140.1esr-1_all.deb",
    ):
        (tmp_path / name).write_bytes(b"")
    assert find_language_packs(tmp_path) == {
        "english": tmp_path / "firefox-esr-l10n-en-gb_140.1esr-1_all.deb",
        "korean": tmp_path / "firefox-esr-l10n-ko_140.2esr-1_all.deb",
    }
