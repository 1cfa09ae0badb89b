"""ember.tokenizers: exact tokenizers written for ember (BPE, SentencePiece, Unigram, tiktoken).

`load(path)` reads any supported file and returns a `Tokenizer`; the reference libraries
(tiktoken, tokenizers, sentencepiece) are only test oracles and benchmark peers.
This package never imports torch.
"""

from ember.tokenizers.base import IncrementalDecoder, Tokenizer
from ember.tokenizers.bpe import ByteLevelBPETokenizer
from ember.tokenizers.loading import load
from ember.tokenizers.sentencepiece_bpe import SentencePieceBPETokenizer

__all__ = [
    "ByteLevelBPETokenizer",
    "IncrementalDecoder",
    "SentencePieceBPETokenizer",
    "Tokenizer",
    "load",
]
