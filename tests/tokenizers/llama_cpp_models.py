"""Where llama.cpp's vocab-only GGUFs and their test vectors lie (its models/ folder).

llama.cpp ships `ggml-vocab-NAME.gguf` with `.inp` (texts, separated by a marker line) and
`.out` (one line of token ids per text, written by the model's HF tokenizer, which llama.cpp's
own test-tokenizer-0 checks llama.cpp against). `.ci/fetch-llama-cpp-models` extracts them from
the llama-cpp-python sdist into the cache folder below; `$EMBER_LLAMA_CPP_MODELS` points
elsewhere (e.g. a llama.cpp checkout's models/). Tests skip with a reason when neither exists.
"""

from __future__ import annotations

from pathlib import Path

from ember.bench.tokenizer_languages import LLAMA_CPP_MODELS_ENV as MODELS_ENV
from ember.bench.tokenizer_languages import llama_cpp_models_dir

__all__ = ["llama_cpp_models_dir", "missing_reason", "read_vectors", "vocab_names"]
SEPARATOR = "\n__ggml_vocab_test__\n"


def missing_reason(folder: Path) -> str:
    return (
        f"llama.cpp's vocab test vectors are not at {folder}: run .ci/fetch-llama-cpp-models "
        f"(pip downloads the llama-cpp-python sdist, about 15 s) or set ${MODELS_ENV} to a llama.cpp "
        "models/ folder"
    )


def vocab_names(folder: Path) -> list[str]:
    """NAME of every ggml-vocab-NAME.gguf in `folder` that has .inp and .out vectors."""
    if not folder.is_dir():
        return []
    return sorted(
        path.name[len("ggml-vocab-") : -len(".gguf.inp")]
        for path in folder.glob("ggml-vocab-*.gguf.inp")
        if path.with_suffix(".out").is_file()
    )


def read_vectors(folder: Path, name: str) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs, read as llama.cpp's test-tokenizer-0 reads them."""
    # Bytes, not read_text: universal newlines would turn the texts' "\r\n" into "\n".
    raw = (folder / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    texts = raw.split(SEPARATOR)
    if texts and texts[-1] == "":
        texts.pop()  # the file ends with a marker
    lines = (folder / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").splitlines()
    if len(texts) != len(lines):
        raise ValueError(f"ggml-vocab-{name}: {len(texts)} texts but {len(lines)} id lines")
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, lines, strict=True)]
