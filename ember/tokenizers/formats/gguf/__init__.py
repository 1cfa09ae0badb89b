"""Tokenizers from GGUF metadata (`tokenizer.ggml.*`): the vocabularies, llama.cpp's pre-tokenizer names and its
WordPiece."""
