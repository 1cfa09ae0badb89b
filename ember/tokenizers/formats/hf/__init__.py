"""HF tokenizer.json and the folder around it: the fast byte-level path and the general pipeline (normalizer,
pre-tokenizer, model, added tokens)."""
