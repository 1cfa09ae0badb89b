"""Readers of the files tokenizers come in: HF tokenizer.json folders (`hf/`), GGUF metadata (`gguf/`), tiktoken rank
files, llama2.c `tokenizer.bin` and SentencePiece `.model` files. `ember.tokenizers.load` picks one."""
