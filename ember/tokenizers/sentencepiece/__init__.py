"""SentencePiece-style tokenizers: the scored vocabulary they share, BPE with scores as merge priorities, and
Unigram LM tokenization."""
