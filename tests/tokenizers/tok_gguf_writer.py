"""Writes GGUF vocab-only files with the `gguf` package (the reference writer) for tests."""

from __future__ import annotations

import pytest


def write_vocab_gguf(path, model, tokens, types, **fields):
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    for name, value in fields.items():
        getattr(writer, f"add_{name}")(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
