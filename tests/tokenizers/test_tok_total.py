"""`encode` is total and `decode` inverts it, for every kind of tokenizer ember loads.

Given any Python str (every plane, unassigned code points, controls, lone surrogates),
encode returns valid ids, and decode gives back the text: lone surrogates come back as
U+FFFD (tiktoken's rule; see `replace_lone_surrogates`), and a byte-level vocabulary that
lacks a byte (SmolLM2 has no token for 0xF1) drops exactly that byte, as the `tokenizers`
library and llama.cpp do. The supplementary-plane cases are checked against `tokenizers`.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.tokenizers import ByteLevelBPETokenizer
from ember.tokenizers.base import replace_lone_surrogates

# Shared tokenizer files, one per loader and model kind.
TOKENIZER_FILES = {
    "r50k": "tokenizers/tiktoken/r50k_base.tiktoken",
    "cl100k": "tokenizers/tiktoken/cl100k_base.tiktoken",
    "o200k": "tokenizers/tiktoken/o200k_base.tiktoken",
    "llama3": "tokenizers/llama3/tokenizer.model",
    "gpt2-folder": "tokenizers/gpt2",
    "smollm2-json": "tokenizers/smollm2/tokenizer.json",
    "qwen2.5-json": "tokenizers/qwen2.5/tokenizer.json",
    "smollm2-gguf": "models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf",
    "llama2-model": "tokenizers/llama2/tokenizer.model",
    "llama2c-bin": "tokenizers/llama2/tokenizer.bin",
    "minilm-wordpiece": "tokenizers/minilm/tokenizer.json",
}
# Lossy by design (lowercasing, accent stripping, whitespace dropped): only totality holds.
LOSSY = {"minilm-wordpiece"}

any_text = st.text(
    alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()),
    max_size=40,
)
supplementary = st.lists(st.integers(0x10000, 0x10FFFF).map(chr), max_size=6).map("".join)


@pytest.fixture(scope="module", params=sorted(TOKENIZER_FILES))
def case(request, load_shared):
    """(name, tokenizer) for each shared tokenizer file."""
    return request.param, load_shared(TOKENIZER_FILES[request.param])


def expected_round_trip(tokenizer, text: str) -> str:
    """What decode(encode(text)) must give: the text with lone surrogates as U+FFFD and the
    bytes the vocabulary cannot spell removed."""
    clean = replace_lone_surrogates(text)
    if not isinstance(tokenizer, ByteLevelBPETokenizer) or not tokenizer.missing_bytes:
        return clean
    kept = bytes(byte for byte in clean.encode() if byte not in tokenizer.missing_bytes)
    return kept.decode("utf-8", errors="replace")


def check_total(case, text: str) -> None:
    name, tokenizer = case
    ids = tokenizer.encode(text, allowed_special=())
    assert all(isinstance(i, int) and 0 <= i < tokenizer.vocab_size for i in ids), ids
    if name not in LOSSY:
        assert tokenizer.decode(ids) == expected_round_trip(tokenizer, text)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.one_of(any_text, supplementary))
def test_encode_is_total_and_decode_inverts_it(case, text):
    check_total(case, text)


def test_every_plane_and_every_byte_encodes(case):
    rng = random.Random(16)
    samples = [chr(rng.randint(plane << 16, (plane << 16) | 0xFFFF)) for plane in range(17)] * 4
    samples += ["\ud932\udeb3", "\ud800", "a\udfffb", chr(0x5CAB3), "".join(map(chr, range(32)))]
    for text in samples:
        check_total(case, text)


def test_lone_surrogates_encode_as_the_replacement_character(case):
    _, tokenizer = case
    assert tokenizer.encode("a\ud800b", allowed_special=()) == tokenizer.encode(
        "a\ufffdb", allowed_special=()
    )


@pytest.mark.parametrize("folder", ["smollm2", "qwen2.5"])
def test_supplementary_planes_and_controls_match_hf_tokenizers(shared_dir, load_shared, folder):
    tokenizers = pytest.importorskip("tokenizers")
    path = shared_dir / "tokenizers" / folder / "tokenizer.json"
    reference = tokenizers.Tokenizer.from_file(str(path))
    ours = [load_shared(f"tokenizers/{folder}/tokenizer.json")]
    if folder == "smollm2":
        ours.append(load_shared(TOKENIZER_FILES["smollm2-gguf"]))
    rng = random.Random(15)
    samples = [chr(rng.randint(0x10000, 0x10FFFF)) for _ in range(300)]
    samples += ["".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(8)) for _ in range(200)]
    samples += [chr(code) for code in range(32)] + ["!\x04!", "a\x04b", "x" + chr(0x5CAB3)]
    samples = [replace_lone_surrogates(text) for text in samples]
    for tokenizer in ours:
        mismatches = [t for t in samples if tokenizer.encode(t) != reference.encode(t).ids]
        assert mismatches == [], f"{len(mismatches)} differ, first: {mismatches[:3]!r}"


def test_the_smollm2_gguf_encodes_u5cab3_as_hf_does(load_shared):
    assert load_shared(TOKENIZER_FILES["smollm2-gguf"]).encode(chr(0x5CAB3)) == [246, 120, 128]
