"""Text before and around a tokenizer model, shared by every kind: pre-tokenization patterns, GPT-2's byte map,
normalizers (HF and SentencePiece), special-token splitting, piece kinds and piece caches. Imports nothing else of
ember.tokenizers."""
