"""`load(path)`: one entry point that recognises every tokenizer file ember reads."""

from __future__ import annotations

from pathlib import Path

from ember.gguf_file import GGUF_MAGIC
from ember.tokenizers.base import Tokenizer
from ember.tokenizers.formats.gguf.vocab import load_gguf
from ember.tokenizers.formats.hf.tokenizer_json import (
    load_gpt2_folder,
    load_tokenizer_json,
    load_vocab_and_merges,
)
from ember.tokenizers.formats.llama2c import load_llama2c, looks_like_llama2c
from ember.tokenizers.formats.sentencepiece_model import (
    load_sentencepiece_model,
    looks_like_sentencepiece_model,
)
from ember.tokenizers.formats.tiktoken_files import load_tiktoken, looks_like_tiktoken

SUPPORTED = (
    "a .gguf model or vocab-only file, a llama2.c tokenizer.bin, a .tiktoken rank file, an HF "
    "tokenizer.json, a folder with encoder.json + vocab.bpe or vocab.json + merges.txt, or a SentencePiece .model"
)


def load(path: str | Path) -> Tokenizer:
    """The tokenizer stored at `path`; the format is recognised by content, not by name.

    A folder is searched for tokenizer.json, then encoder.json + vocab.bpe, then vocab.json +
    merges.txt, then tokenizer.model, then tokenizer.bin.
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
    if head.lstrip().startswith(b"{"):
        return load_tokenizer_json(path)
    if looks_like_tiktoken(head):
        return load_tiktoken(path)
    if looks_like_sentencepiece_model(head):
        return load_sentencepiece_model(path)
    if looks_like_llama2c(path.read_bytes()):
        return load_llama2c(path)
    raise ValueError(f"{path}: not a tokenizer file ember recognises; expected {SUPPORTED}")


def _load_folder(folder: Path) -> Tokenizer:
    if (folder / "tokenizer.json").is_file():
        return load(folder / "tokenizer.json")
    if (folder / "encoder.json").is_file() and (folder / "vocab.bpe").is_file():
        return load_gpt2_folder(folder)
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return load_vocab_and_merges(folder)
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer.bin"):
        if (folder / name).is_file():
            return load(folder / name)
    raise ValueError(f"{folder}: holds no tokenizer file; expected {SUPPORTED}")
