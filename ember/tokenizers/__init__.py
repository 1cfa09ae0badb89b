"""ember.tokenizers: exact tokenizers written for ember (BPE, SentencePiece, Unigram, tiktoken).

`load(path)` reads any supported file and returns a `Tokenizer`; the reference libraries
(tiktoken, tokenizers, sentencepiece) are only test oracles and benchmark peers.
This package never imports torch. The names below load their modules on first use, so importing one
module of the package (`ember tokenize --help` imports `cli.py`) does not load every reader.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ember.tokenizers.base import IncrementalDecoder, Tokenizer
    from ember.tokenizers.bpe.byte_level_bpe import ByteLevelBPETokenizer
    from ember.tokenizers.loading import load
    from ember.tokenizers.sentencepiece.bpe import SentencePieceBPETokenizer

_EXPORTS = {
    "ByteLevelBPETokenizer": "ember.tokenizers.bpe.byte_level_bpe",
    "IncrementalDecoder": "ember.tokenizers.base",
    "SentencePieceBPETokenizer": "ember.tokenizers.sentencepiece.bpe",
    "Tokenizer": "ember.tokenizers.base",
    "load": "ember.tokenizers.loading",
}

__all__ = ["ByteLevelBPETokenizer", "IncrementalDecoder", "SentencePieceBPETokenizer", "Tokenizer", "load"]


def __getattr__(name: str) -> object:
    """`from ember.tokenizers import load` (and the others) imports the defining module then (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ember.tokenizers' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
