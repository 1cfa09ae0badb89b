"""llama.cpp's own tokenizer test vectors, without llama.cpp: every ggml-vocab-NAME.gguf that
ships .inp/.out vectors, token for token.

The .out ids are what the model's HF tokenizer gives (llama.cpp's convert_hf_to_gguf_update.py
writes them) and what llama.cpp's test-tokenizer-0 holds llama.cpp to, read and called the
same way here (add_special=false, parse_special=false: `allowed_special=()`). Tolerance: none.
The folder comes from `.ci/fetch-llama-cpp-models` or $EMBER_LLAMA_CPP_MODELS; without it the
tests skip, naming how to get it.
"""

from __future__ import annotations

import pytest
from llama_cpp_models import llama_cpp_models_dir, missing_reason, read_vectors, vocab_names

from ember.tokenizers import load

FOLDER = llama_cpp_models_dir()
# Vocabularies llama.cpp tests that ember refuses on purpose, and the word its error uses.
REFUSED = {"gemma-4": "gemma4"}


def _names() -> list[str]:
    return vocab_names(FOLDER) or [pytest.param("", marks=pytest.mark.skip(missing_reason(FOLDER)))]


@pytest.mark.parametrize("name", _names())
def test_ember_gives_llama_cpps_expected_ids(name):
    path = FOLDER / f"ggml-vocab-{name}.gguf"
    if name in REFUSED:
        with pytest.raises(ValueError, match=f"{REFUSED[name]}.*not supported"):
            load(path)
        return
    ours = load(path)
    mismatches = []
    for text, expected in read_vectors(FOLDER, name):
        got = ours.encode(text, allowed_special=())
        if got != expected:
            mismatches.append((text[:60], got[:12], expected[:12]))
    assert mismatches == [], f"{name}: {len(mismatches)} vectors differ, first {mismatches[:3]}"
