"""Byte-level BPE (GPT-2, tiktoken encodings, Llama 3, Qwen2): the tokenizer and the merge loop (pure Python, or
compiled on first use)."""
