"""`load(path)`: one entry point that recognises every tokenizer file ember reads."""

from __future__ import annotations

from pathlib import Path

from ember.tokenizers.base import Tokenizer
from ember.tokenizers.gguf_metadata import GGUF_MAGIC
from ember.tokenizers.gguf_vocab import load_gguf
from ember.tokenizers.llama2c import load_llama2c, looks_like_llama2c

SUPPORTED = (
    "a .gguf model or vocab-only file, a llama2.c tokenizer.bin, a .tiktoken rank file, an HF "
    "tokenizer.json, a folder with encoder.json + vocab.bpe, or a SentencePiece .model"
)


def load(path: str | Path) -> Tokenizer:
    """The tokenizer stored at `path`; the format is recognised by content, not by name.

    A folder is searched for tokenizer.json, then encoder.json + vocab.bpe, then
    tokenizer.model, then tokenizer.bin.
    """
    path = Path(path)
    if path.is_dir():
        return _load_folder(path)
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer file at {path}; expected {SUPPORTED}")
    with path.open("rb") as handle:
        head = handle.read(64)
    if head.startswith(GGUF_MAGIC):
        return load_gguf(path)
    data = path.read_bytes()
    if looks_like_llama2c(data):
        return load_llama2c(path)
    raise ValueError(f"{path}: not a tokenizer file ember recognises; expected {SUPPORTED}")


def _load_folder(folder: Path) -> Tokenizer:
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer.bin"):
        if (folder / name).is_file():
            return load(folder / name)
    raise ValueError(f"{folder}: holds no tokenizer file; expected {SUPPORTED}")
